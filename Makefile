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
# VG=1: a build for valgrind in build-vg/. Valgrind does not decode AVX-512, so it targets
# AVX2 (x86-64-v3); the kernels have AVX2 paths, and oneDNN picks its own at run time.
VG      ?= 0
MARCH   := -march=native
ifeq ($(SAN),1)
BUILD   := build-san
SANFLAGS := -fsanitize=address,undefined
OPT     := -O1 -g -fno-omit-frame-pointer $(SANFLAGS) -fno-sanitize-recover=undefined
else ifeq ($(VG),1)
BUILD   := build-vg
SANFLAGS :=
OPT     := -O1 -g
MARCH   := -march=x86-64-v3
else
BUILD   := build
SANFLAGS :=
OPT     := -O3 -g
endif
# -Wno-format-truncation: paths and messages are bounded on purpose; a cut message is not a bug.
# -fno-math-errno: sqrtf and friends then need not set errno (nothing here reads it), so gcc
# vectorises loops that call them; without it AdamW's update ran one element at a time
# (vsqrtss/vdivss) at 12-16 GB/s where the same loop vectorised streams 40-53 GB/s. Results
# are unchanged: the vector sqrt and divide round exactly as the scalar ones.
CFLAGS  := -std=c11 -D_GNU_SOURCE $(OPT) $(MARCH) -fopenmp -fno-math-errno -Wall -Wextra -Werror -Wno-format-truncation -Isrc -MMD -MP
LDLIBS  := -ldnnl -lyaml -lcjson -lz -lm -lpthread -ldl $(MPI_LIBS)
# Where gemm_mkl.c looks for libmkl_rt first (tools/install_deps.sh pip-installs `mkl` into the
# venv). The valgrind build leaves it out: MKL's start-up probing is not what valgrind checks.
ifeq ($(VG),1)
MKL_DIR :=
else
MKL_DIR := $(CURDIR)/.venv/lib
endif
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

.PHONY: all test check clean bench fuzz
all: $(BUILD)/stepscope $(TEST_BIN) $(BENCH_BIN)
bench: $(BENCH_BIN)

$(BUILD)/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/src/dist/comm_mpi.o: CFLAGS += $(MPI_CFLAGS)
$(BUILD)/src/kernels/gemm_mkl.o: CFLAGS += -DSTEPSCOPE_MKL_DIR='"$(MKL_DIR)"'


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

# What CI runs: the suite on the optimised build, then the C tests again under ASan+UBSan;
# the valgrind build is what the end-to-end leak test runs. The fuzz targets are built too where
# clang is (CI runs them first): each links a subset of the modules, which a change can break.
check:
	$(MAKE) -j2 all
	$(MAKE) -j2 SAN=1 all
	$(MAKE) -j2 VG=1 build-vg/stepscope
	if command -v $(FUZZ_CC) >/dev/null; then $(MAKE) -j2 fuzz; fi
	BUILDS="build build-san" tests/run.sh

# libFuzzer targets (clang; fuzz/run.sh runs them). Each links only the modules it reads
# with, compiled again by clang with the fuzzer's coverage and ASan+UBSan: no OpenMP, no oneDNN.
FUZZ_BUILD  := build-fuzz
FUZZ_CC     := clang
FUZZ_SAN    := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link $(FUZZ_SAN) \
               -Wall -Wextra -Werror -Wno-unknown-pragmas -Isrc -Ifuzz -MMD -MP
FUZZ_TARGETS := config_yaml config_override safetensors tokens full_state
FUZZ_SRC_config_yaml     := src/config/config.c
FUZZ_SRC_config_override := src/config/config.c
FUZZ_SRC_safetensors     := src/io/safetensors.c src/util/atomic_file.c src/model/qwen3_params.c
FUZZ_SRC_tokens          := src/data/tokens.c src/data/data.c src/data/synthetic.c
FUZZ_SRC_full_state      := src/train/resume.c src/train/checkpoint.c src/io/safetensors.c src/util/atomic_file.c \
                            src/model/qwen3_params.c src/kernels/bf16.c src/config/config.c
FUZZ_LIBS_config_yaml     := -lyaml
FUZZ_LIBS_config_override := -lyaml
FUZZ_LIBS_safetensors     := -lcjson
FUZZ_LIBS_tokens          :=
FUZZ_LIBS_full_state      := -lcjson -lyaml

fuzz: $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)

$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

define FUZZ_LINK
$(FUZZ_BUILD)/fuzz_$(1): $(FUZZ_BUILD)/obj/fuzz/$(1).o $(FUZZ_SRC_$(1):%.c=$(FUZZ_BUILD)/obj/%.o)
	$(FUZZ_CC) -fsanitize=fuzzer $(FUZZ_SAN) -o $$@ $$^ $(FUZZ_LIBS_$(1))
endef
$(foreach t,$(FUZZ_TARGETS),$(eval $(call FUZZ_LINK,$(t))))

clean:
	rm -rf build build-san build-vg $(FUZZ_BUILD)

-include $(shell find $(BUILD) $(FUZZ_BUILD) -name '*.d' 2>/dev/null)
