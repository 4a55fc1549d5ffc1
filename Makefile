# tally: build, test, demo, bench.
#   make            library (build/lib/libtally.{so,a}), command-line tool, demo
#   make demo       the main job: a training-like workload, then what tally knows
#   make test       every cmocka test binary, then the Python tests
#   make bench      benchmarks (bench/)
#   make asan | ubsan | tsan   the test suite under a sanitizer
CC       ?= cc
BUILD    ?= build
CUDA_HOME ?= /usr/local/cuda
OPT      ?= -O2
SAN      ?=

WARN    := -Wall -Wextra -Wpedantic -Wstrict-prototypes -Wshadow -Wno-unused-parameter
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -g $(WARN) -fvisibility=hidden -fPIC $(SAN) -Iinclude -Ilib
LDLIBS  := -lpthread -ldl -lm

# The cuda backend is compiled in when CUDA's headers and runtime are found.
HAVE_CUDA := $(shell test -f $(CUDA_HOME)/include/cuda_runtime_api.h && test -e $(CUDA_HOME)/lib64/libcudart.so && echo 1)
ifeq ($(HAVE_CUDA),1)
CFLAGS  += -DTALLY_HAVE_CUDA -isystem $(CUDA_HOME)/include
LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart -Wl,-rpath,$(CUDA_HOME)/lib64
endif

LIB_SRC  := $(sort $(wildcard lib/*.c))
LIB_OBJ  := $(LIB_SRC:lib/%.c=$(BUILD)/obj/%.o)
# C++ (lib/torch_oom.cc, the OOM exception for PyTorch): libtally.so only.
CXX      ?= c++
CXXFLAGS += -std=c++17 $(OPT) -g -Wall -Wextra -fvisibility=hidden -fPIC $(SAN) -Iinclude -Ilib
LIB_CXX_SRC := $(sort $(wildcard lib/*.cc))
LIB_CXX_OBJ := $(LIB_CXX_SRC:lib/%.cc=$(BUILD)/obj/%.o)
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TESTS    := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
SETUP    := $(BUILD)/.setup-ok

.PHONY: all lib demo test test-c test-py bench asan ubsan tsan clean setup
all: lib $(BUILD)/bin/demo $(if $(wildcard tools/tally_cli.c),$(BUILD)/bin/tally)

lib: $(BUILD)/lib/libtally.so $(BUILD)/lib/libtally.a

setup: $(SETUP)
$(SETUP): tools/setup.sh
	@bash tools/setup.sh
	@mkdir -p $(BUILD) && touch $@

# The library itself needs only a C compiler (and CUDA if present); the
# Debian packages of tools/setup.sh are for the tests and benchmarks.
$(BUILD)/obj/%.o: lib/%.c $(wildcard lib/*.h) include/tally.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: lib/%.cc include/tally.h
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

# tally_torch_alloc may unwind a C++ exception (torch_oom.cc) through its frame.
$(BUILD)/obj/torch_abi.o: CFLAGS += -fexceptions

$(BUILD)/lib/libtally.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# Only tally_* symbols leave the shared library (visibility plus a version script).
$(BUILD)/lib/libtally.so: $(LIB_OBJ) $(LIB_CXX_OBJ) lib/exports.map
	@mkdir -p $(dir $@)
	$(CXX) -shared $(SAN) -o $@ $(LIB_OBJ) $(LIB_CXX_OBJ) -Wl,--version-script=lib/exports.map $(LDLIBS)

$(BUILD)/bin/tally: tools/tally_cli.c $(wildcard tools/*.h) $(BUILD)/lib/libtally.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/lib/libtally.a $(LDLIBS)

$(BUILD)/bin/demo: tools/demo.c $(BUILD)/lib/libtally.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/lib/libtally.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(BUILD)/lib/libtally.a $(BUILD)/lib/libtally.so | $(SETUP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Wno-pedantic -o $@ $< $(BUILD)/lib/libtally.a -lcmocka $(LDLIBS)

demo: $(BUILD)/bin/demo
	$(BUILD)/bin/demo

# Each test binary runs alone (cmocka prints its own summary); the last line
# sums them up. TEST_FILTER=summary runs test_summary only.
test: test-c test-py
test-c: $(TESTS) $(BUILD)/lib/libtally.so $(if $(wildcard tools/tally_cli.c),$(BUILD)/bin/tally)
	@bash tests/check_exports.sh $(BUILD)/lib/libtally.so
	@BUILD=$(BUILD) bash tests/run.sh $(TESTS)
test-py: lib
	@if [ -d python/tests ]; then TALLY_LIB=$(CURDIR)/$(BUILD)/lib/libtally.so PYTHONPATH=python python3 -m unittest discover -s python/tests -t python; fi

bench: all | $(SETUP)
	$(MAKE) -C bench BUILD=$(abspath $(BUILD))
	bash bench/run.sh $(abspath $(BUILD))

asan:
	$(MAKE) test-c BUILD=build-asan SAN="-fsanitize=address -fno-omit-frame-pointer" OPT=-O1
ubsan:
	$(MAKE) test-c BUILD=build-ubsan SAN="-fsanitize=undefined -fno-sanitize-recover=undefined" OPT=-O1
tsan:
	$(MAKE) test-c BUILD=build-tsan SAN="-fsanitize=thread" OPT=-O1

clean:
	rm -rf build build-asan build-ubsan build-tsan

# ---- fuzzing ----
# make fuzz        libFuzzer targets (tests/fuzz/fuzz_*.c), built with clang
#                  (-fsanitize=fuzzer,address,undefined) into build-fuzz/, each
#                  run FUZZ_SECONDS (default 60) from its seed corpus
#                  tests/fuzz/corpus/<target>/; FUZZ_TARGETS=fuzz_api runs one.
#                  tests/fuzz/run.sh prints executions, coverage and crashes.
# make fuzz-build  only build them.
# make fuzz-replay every seed and regression input (tests/fuzz/corpus,
#                  tests/fuzz/regressions) through each target built with $(CC)
#                  and no libFuzzer; `make test-c` runs it first, so a crash
#                  once found stays fixed (under asan / ubsan / tsan too).
FUZZ_CC      ?= clang
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_JOBS    ?= 1
FUZZ_COVERAGE = -fsanitize=fuzzer-no-link
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS  := -std=c11 -D_GNU_SOURCE -O1 -g $(WARN) -Wno-pedantic -fvisibility=hidden -Iinclude -Ilib -Itools
# 16 ended stages kept instead of 256 (lib/stage.h): the history is
# process-wide, and at 256 the JSON report fuzz_api parses back was 130 KB.
FUZZ_CFLAGS  += -DTALLY_STAGE_HISTORY=16
FUZZ_NAMES   := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_TARGETS ?= $(FUZZ_NAMES)
# lib/meta.c's private heap hides metadata overflows from ASan: the fuzz
# build takes its metadata from malloc instead (tests/fuzz/meta_malloc.c).
FUZZ_LIB_SRC := $(filter-out lib/meta.c,$(LIB_SRC)) tests/fuzz/meta_malloc.c
FUZZ_LIB_OBJ := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(FUZZ_LIB_SRC))
FUZZ_BINS    := $(FUZZ_NAMES:%=$(FUZZ_BUILD)/%)
FUZZ_OK      := $(FUZZ_BUILD)/.libfuzzer-ok

.PHONY: fuzz fuzz-build fuzz-replay
fuzz: fuzz-build
	@FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) bash tests/fuzz/run.sh $(FUZZ_TARGETS)

fuzz-build: $(FUZZ_BINS)

# clang must be able to link a libFuzzer program; say what to install if not.
$(FUZZ_OK):
	@mkdir -p $(FUZZ_BUILD)
	@printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
		> $(FUZZ_BUILD)/probe.c
	@if ! $(FUZZ_CC) -fsanitize=fuzzer,address,undefined $(FUZZ_BUILD)/probe.c -o $(FUZZ_BUILD)/probe \
		>$(FUZZ_BUILD)/probe.log 2>&1; then \
		v=$$($(FUZZ_CC) -dumpversion 2>/dev/null | cut -d. -f1); \
		echo "fuzz: '$(FUZZ_CC) -fsanitize=fuzzer' cannot link (clang or its libFuzzer runtime is missing):" >&2; \
		sed 's/^/  /' $(FUZZ_BUILD)/probe.log | head -5 >&2; \
		echo "fuzz: run: sudo apt-get install -y clang libclang-rt-$${v:-14}-dev" >&2; \
		exit 1; \
	fi
	@touch $@

$(FUZZ_BUILD)/obj/%.o: %.c $(wildcard lib/*.h) include/tally.h | $(FUZZ_OK)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_COVERAGE) $(FUZZ_SAN) -c $< -o $@

$(FUZZ_BUILD)/obj/lib/torch_abi.o: FUZZ_CFLAGS += -fexceptions
# tree.c (the pools) and check.c (tally_check's recounts) are built without
# coverage instrumentation (ASan still checks them): their loops over bins,
# segments and ledger rows were a third of fuzz_api's time in comparison
# hooks, and their branches say nothing about the API's behaviour.
$(FUZZ_BUILD)/obj/lib/tree.o: FUZZ_COVERAGE :=
$(FUZZ_BUILD)/obj/lib/check.o: FUZZ_COVERAGE :=

$(FUZZ_BUILD)/libtally-fuzz.a: $(FUZZ_LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

FUZZ_SRC     := $(wildcard tests/fuzz/fuzz_*.c tests/fuzz/*.h)
$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_SRC) $(wildcard tools/*.h tools/*.c) $(FUZZ_BUILD)/libtally-fuzz.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(FUZZ_SAN) -o $@ $< $(FUZZ_BUILD)/libtally-fuzz.a -lpthread -ldl -lm

# Replay: the same targets with a plain main (tests/fuzz/replay_main.c),
# against the library of $(BUILD) (so `make asan` replays under ASan).
REPLAY_BINS := $(FUZZ_NAMES:%=$(BUILD)/fuzz-replay/%)
$(BUILD)/fuzz-replay/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/replay_main.c $(FUZZ_SRC) $(wildcard tools/*.h tools/*.c) $(BUILD)/lib/libtally.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Wno-pedantic -Itools -o $@ $< tests/fuzz/replay_main.c $(BUILD)/lib/libtally.a $(LDLIBS)

fuzz-replay: $(REPLAY_BINS)
	@bash tests/fuzz/replay.sh $(BUILD)/fuzz-replay $(FUZZ_NAMES)

test-c: fuzz-replay

.PHONY: clean-fuzz
clean-fuzz:
	rm -rf $(FUZZ_BUILD)
clean: clean-fuzz

# ---- mutation testing ----
# make mutate   applies each one-line mutation of tests/mutate/mutations.txt
#               to a scratch copy of the tree, runs the C tests, prints the
#               survivors and the score (minutes; not part of .ci/run).
#               MUTATE_ONLY=REGEX runs the matching entries only.
.PHONY: mutate
mutate: export MUTATE_ONLY := $(MUTATE_ONLY)
mutate:
	@nice -n 10 bash tests/mutate/mutate.sh
