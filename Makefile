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
