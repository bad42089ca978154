# stepscope build. `make` builds build/stepscope and the test binaries; `make test` runs the suite.
# SAN=1 builds everything with ASan+UBSan into build-san/.
CC      ?= gcc
SAN     ?= 0
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
LDLIBS  := -ldnnl -lyaml -lcjson -lz -lm -lpthread
LDFLAGS := -fopenmp $(SANFLAGS)

LIB_SRC  := $(filter-out src/main.c,$(shell find src -name '*.c' | sort))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(shell find tests -maxdepth 1 -name 'test_*.c' | sort)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(shell find bench -maxdepth 1 -name '*.c' | sort)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all test check clean bench
all: $(BUILD)/stepscope $(TEST_BIN) $(BENCH_BIN)
bench: $(BENCH_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libstepscope.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/stepscope: $(BUILD)/src/main.o $(BUILD)/libstepscope.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libstepscope.a
	$(CC) $(LDFLAGS) -o $@ $^ -lcmocka $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libstepscope.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

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
