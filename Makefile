# stepscope build. `make` builds build/stepscope and the test binaries; `make test` runs the suite.
# SAN=1 builds everything with ASan+UBSan into build-san/.
# MPI: found through mpicc (Open MPI's `--showme`, else MPICH's pkg-config file) and used when
# present; MPI=0 builds the one-process communicator (src/dist/comm_none.c) instead.
CC      ?= gcc
SAN     ?= 0
MPI     ?= $(if $(shell command -v mpicc 2>/dev/null),1,0)
ifeq ($(MPI),1)
# -isystem: MPI's headers are not ours to keep -Wextra-clean.
MPI_CFLAGS := $(patsubst -I%,-isystem %,$(shell mpicc --showme:compile 2>/dev/null || pkg-config --cflags mpich 2>/dev/null))
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null || pkg-config --libs mpich 2>/dev/null)
COMM_DROP  := src/dist/comm_none.c
else
MPI_CFLAGS :=
MPI_LIBS   :=
COMM_DROP  := src/dist/comm_mpi.c
endif
ifeq ($(SAN),1)
BUILD   := build-san
SANFLAGS := -fsanitize=address,undefined
OPT     := -O1 -g -fno-omit-frame-pointer $(SANFLAGS) -fno-sanitize-recover=undefined
else
BUILD   := build
SANFLAGS :=
OPT     := -O3 -g
endif
# -Wno-format-truncation: paths and messages are bounded on purpose; a cut message is not a bug.
CFLAGS  := -std=c11 -D_GNU_SOURCE $(OPT) -march=native -fopenmp -Wall -Wextra -Werror -Wno-format-truncation -Isrc -MMD -MP
LDLIBS  := -ldnnl -lyaml -lcjson -lz -lm -lpthread $(MPI_LIBS)
LDFLAGS := -fopenmp $(SANFLAGS)

LIB_SRC  := $(filter-out src/main.c $(COMM_DROP),$(shell find src -name '*.c' | sort))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(shell find tests -maxdepth 1 -name 'test_*.c' | sort)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(shell find bench -maxdepth 1 -name '*.c' | sort)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
# With MPI, test_dist also runs against the one-process backend (comm_none.o linked ahead of
# the archive), so the build without MPI cannot rot unnoticed.
ifeq ($(MPI),1)
TEST_BIN += $(BUILD)/tests/test_dist_nompi
endif

.PHONY: all test check clean bench
all: $(BUILD)/stepscope $(TEST_BIN) $(BENCH_BIN)
bench: $(BENCH_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/src/dist/comm_mpi.o: CFLAGS += $(MPI_CFLAGS)

# Remembers the MPI setting, so switching MPI=0/1 rebuilds the archive.
MPI_STAMP := $(BUILD)/mpi-$(MPI).stamp
$(MPI_STAMP):
	@mkdir -p $(BUILD) && rm -f $(BUILD)/mpi-*.stamp && touch $@

$(BUILD)/libstepscope.a: $(LIB_OBJ) $(MPI_STAMP)
	@rm -f $@
	ar rcs $@ $(LIB_OBJ)

$(BUILD)/stepscope: $(BUILD)/src/main.o $(BUILD)/libstepscope.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libstepscope.a
	$(CC) $(LDFLAGS) -o $@ $^ -lcmocka $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libstepscope.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(BUILD)/tests/test_dist_nompi: $(BUILD)/tests/test_dist.o $(BUILD)/src/dist/comm_none.o $(BUILD)/libstepscope.a
	$(CC) $(LDFLAGS) -o $@ $^ -lcmocka $(LDLIBS)

test: all
	BUILDS=$(BUILD) tests/run.sh

# What CI runs: the suite on the optimised build, then the C tests again under ASan+UBSan.
check:
	$(MAKE) -j2 all
	$(MAKE) -j2 SAN=1 all
	BUILDS="build build-san" tests/run.sh

clean:
	rm -rf build build-san

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
