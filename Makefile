# tally: build, test, demo, bench.
#   make            library (build/lib/libtally.{so,a}), command-line tool, demo
#   make demo       the main job: a training-like workload, then what tally knows
#   make test       every cmocka test binary, the Python tests and the check
#                   scripts (tests/check_*.sh); one line each, then the total
#   make bench      benchmarks (bench/)
#   make asan | ubsan | tsan   the test suite under a sanitizer
#   make mutate     mutation testing; make coverage: the lines no test runs
#   make cross-aarch64   the library for aarch64 (cross compilers), in build-aarch64/
#   make install     PREFIX (/usr/local), DESTDIR: the library (libtally.so.0,
#                    versioned), libtally.a, tally.h, the tally command and
#                    tally.pc for pkg-config; make uninstall removes them
CC       ?= cc
BUILD    ?= build
OPT      ?= -O2
SAN      ?=

# The three that GCC 14 makes errors by default are errors here with any
# compiler: a pointer of the wrong type, an integer for a pointer, a call to
# an undeclared function (docs/testing.md: two arguments of different pointer
# types swapped does not build).
WARN    := -Wall -Wextra -Wpedantic -Wstrict-prototypes -Wshadow -Wno-unused-parameter \
           -Werror=incompatible-pointer-types -Werror=int-conversion -Werror=implicit-function-declaration
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -g $(WARN) -fvisibility=hidden -fPIC $(SAN) -Iinclude -Ilib
LDLIBS  := -lpthread -ldl -lm

# The cuda and async backends (lib/backend/cuda/) are always compiled: they open
# libcuda.so.1 with dlopen at run time, so the build needs no CUDA toolkit and
# libtally.so depends on no CUDA library.
LIB_SRC  := $(sort $(wildcard lib/*/*.c lib/*/*/*.c))
LIB_HDR  := $(wildcard lib/*/*.h lib/*/*/*.h)
LIB_OBJ  := $(LIB_SRC:lib/%.c=$(BUILD)/obj/%.o)
# C++ (lib/torch/torch_oom.cc, the OOM exception for PyTorch): libtally.so only.
CXX      ?= c++
CXXFLAGS += -std=c++17 $(OPT) -g -Wall -Wextra -fvisibility=hidden -fPIC $(SAN) -Iinclude -Ilib
LIB_CXX_SRC := $(sort $(wildcard lib/*/*.cc))
LIB_CXX_OBJ := $(LIB_CXX_SRC:lib/%.cc=$(BUILD)/obj/%.o)
TEST_SRC := $(sort $(wildcard tests/test_*.c))
# C++ tests (tests/test_*.cc): what only C++ can check (the C++ parts of
# libtally.so, an exception thrown through tally_torch_alloc); they link the
# shared library.
TEST_CXX_SRC := $(sort $(wildcard tests/test_*.cc))
TESTS    := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%) $(TEST_CXX_SRC:tests/%.cc=$(BUILD)/tests/%)
SETUP    := $(BUILD)/.setup-ok

# The shared library's ABI version: its SONAME is libtally.so.$(SOVERSION).
VERSION   := $(shell sed -n 's/^\#define TALLY_VERSION "\(.*\)"/\1/p' include/tally.h)
SOVERSION := $(firstword $(subst ., ,$(VERSION)))
CLI       := $(if $(wildcard tools/tally_cli.c),$(BUILD)/bin/tally)

.PHONY: all lib demo demo-sleep test test-c test-py test-sh bench asan ubsan tsan clean setup install uninstall
all: lib $(BUILD)/bin/demo $(BUILD)/bin/demo-sleep $(CLI)

include tests/standin/standin.mk

lib: $(BUILD)/lib/libtally.so $(BUILD)/lib/libtally.so.$(SOVERSION) $(BUILD)/lib/libtally.a

# tools/setup.sh checks (as root: installs) what each kind of target needs:
# make test a C compiler and cmocka only, make bench also jemalloc and
# mimalloc; make fuzz checks for clang's libFuzzer itself.
SETUP_BENCH := $(BUILD)/.setup-bench-ok
# make and make demo need only the compiler: on a fresh machine, as root,
# setup.sh installs it before the first object is compiled.
SETUP_BUILD := $(BUILD)/.setup-build-ok
setup: $(SETUP)
$(SETUP_BUILD): tools/setup.sh
	@CC="$(CC)" bash tools/setup.sh build
	@mkdir -p $(BUILD) && touch $@
$(LIB_OBJ) $(LIB_CXX_OBJ): | $(SETUP_BUILD)
$(SETUP): tools/setup.sh
	@CC="$(CC)" bash tools/setup.sh test
	@mkdir -p $(BUILD) && touch $@
$(SETUP_BENCH): tools/setup.sh
	@CC="$(CC)" bash tools/setup.sh bench
	@mkdir -p $(BUILD) && touch $@

# The library itself needs only a C compiler (no CUDA: lib/backend/cuda/ loads
# libcuda.so.1 at run time).
$(BUILD)/obj/%.o: lib/%.c $(LIB_HDR) include/tally.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: lib/%.cc include/tally.h
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

# tally_torch_alloc may unwind a C++ exception (torch_oom.cc) through its frame.
$(BUILD)/obj/torch/torch_abi.o: CFLAGS += -fexceptions
# unwinder:fp walks frame pointers from the site capture through tally_malloc
# to its caller (lib/ledger/unwind.c): these frames keep theirs.
$(BUILD)/obj/api/api.o $(BUILD)/obj/ledger/site.o $(BUILD)/obj/ledger/unwind.o $(BUILD)/obj/torch/torch_abi.o: CFLAGS += -fno-omit-frame-pointer

$(BUILD)/lib/libtally.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# Only tally_* symbols leave the shared library (visibility plus a version script).
$(BUILD)/lib/libtally.so: $(LIB_OBJ) $(LIB_CXX_OBJ) lib/exports.map
	@mkdir -p $(dir $@)
	$(CXX) -shared $(SAN) -o $@ $(LIB_OBJ) $(LIB_CXX_OBJ) -Wl,--version-script=lib/exports.map \
		-Wl,-soname,libtally.so.$(SOVERSION) $(LDLIBS)

# What a program linked with -ltally asks the loader for (its SONAME).
$(BUILD)/lib/libtally.so.$(SOVERSION): $(BUILD)/lib/libtally.so
	ln -sf libtally.so $@

# The tally command: tools/tally_cli.c (main, summary, ledger) and its pieces
# (tools/cli_*.c); tally tune (tools/tune*.c, tools/pickle.c, the model of
# PyTorch's expandable segments in tools/pt_expand.c) replays traces with
# bench/trace.c.
CLI_SRC  := $(sort $(wildcard tools/cli_*.c))
TOOL_SRC := $(sort $(wildcard tools/tune*.c)) tools/pickle.c tools/pt_expand.c tests/standin/cost.c bench/trace.c
$(BUILD)/bin/tally: tools/tally_cli.c $(wildcard tools/*.h) $(CLI_SRC) $(TOOL_SRC) bench/trace.h tests/standin/cost.h $(BUILD)/lib/libtally.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(CLI_SRC) $(TOOL_SRC) $(BUILD)/lib/libtally.a $(LDLIBS)

$(BUILD)/bin/demo: tools/demo.c $(BUILD)/lib/libtally.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/lib/libtally.a $(LDLIBS)

$(BUILD)/bin/demo-sleep: tools/demo_sleep.c $(BUILD)/lib/libtally.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/lib/libtally.a $(LDLIBS)

# TEST_LINK: the sources a test links beside its own file (set per test below).
TEST_LINK :=
$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(BUILD)/lib/libtally.a $(BUILD)/lib/libtally.so | $(SETUP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Wno-pedantic -o $@ $< $(TEST_LINK) $(BUILD)/lib/libtally.a -lcmocka $(LDLIBS)

# test_backend_cuda_vmm_replay replays the shared traces with bench/trace.c's reader,
# and the bench's synthetic traces, written by bench/gen_trace.c (its main left out).
$(BUILD)/tests/test_backend_cuda_vmm_replay: tests/test_backend_cuda_vmm_replay.c bench/trace.c bench/trace.h bench/gen_trace.c $(wildcard tests/*.h) $(BUILD)/lib/libtally.a | $(SETUP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Wno-pedantic -Ibench -DGEN_TRACE_NO_MAIN -o $@ $< bench/trace.c bench/gen_trace.c $(BUILD)/lib/libtally.a -lcmocka $(LDLIBS)

# test_bench_alias_model checks bench/alias_model.c (tally-steps --alias-model), priced with the cost table.
$(BUILD)/tests/test_bench_alias_model: tests/test_bench_alias_model.c bench/alias_model.c bench/alias_model.h tests/standin/cost.c tests/standin/cost.h | $(SETUP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Wno-pedantic -Ibench -o $@ $< bench/alias_model.c tests/standin/cost.c -lcmocka $(LDLIBS)

# test_cache_expand_steady replays the shared ddp trace with bench/trace.c's reader.
$(BUILD)/tests/test_cache_expand_steady: tests/test_cache_expand_steady.c bench/trace.c bench/trace.h $(wildcard tests/*.h) $(BUILD)/lib/libtally.a | $(SETUP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Wno-pedantic -Ibench -o $@ $< bench/trace.c $(BUILD)/lib/libtally.a -lcmocka $(LDLIBS)

$(BUILD)/tests/%: tests/%.cc $(wildcard tests/*.h) $(BUILD)/lib/libtally.so $(BUILD)/lib/libtally.so.$(SOVERSION) | $(SETUP)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -o $@ $< -L$(BUILD)/lib -ltally -Wl,-rpath,$(CURDIR)/$(BUILD)/lib -lcmocka $(LDLIBS)

# test_standin_cost checks the stand-in's cost table (tests/standin/cost.c).
$(BUILD)/tests/test_standin_cost: tests/test_standin_cost.c tests/standin/cost.c tests/standin/cost.h $(wildcard tests/*.h) | $(SETUP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Wno-pedantic -Itests -o $@ $< tests/standin/cost.c -lcmocka $(LDLIBS)

# driver.h against CUDA's cuda.h, where a toolkit is installed (only this
# test looks at CUDA_HOME; the library never does).
CUDA_HOME ?= /usr/local/cuda
CUDA_H_DIR := $(if $(wildcard $(CUDA_HOME)/include/cuda.h),$(CUDA_HOME)/include)
$(BUILD)/tests/test_backend_driver_h: tests/test_backend_driver_h.c tests/driver_h_names.sh lib/backend/cuda/driver.h | $(SETUP)
	@mkdir -p $(dir $@)
	CC="$(CC)" bash tests/driver_h_names.sh --cuda-side lib/backend/cuda/driver.h > $(BUILD)/tests/driver_h_cuda.h
	CC="$(CC)" bash tests/driver_h_names.sh lib/backend/cuda/driver.h > $(BUILD)/tests/driver_h_names.h
	$(CC) $(CFLAGS) -Wno-pedantic $(if $(CUDA_H_DIR),-DTALLY_CUDA_H_CHECK -I$(BUILD)/tests -isystem $(CUDA_H_DIR)) \
		-o $@ $< -lcmocka $(LDLIBS)

# The tests of tally tune compile what they test in: test_tune_pickle the
# pickle reader; test_tune_snapshot, test_tune_recorded and test_tune_report
# the readers of snapshots and reports (tools/tune_input.c, bench/trace.c;
# tools/tune_input_report.c linked beside them, as for test_tune_bad_input);
# test_tune_run the replays (tools/tune_run.c, with tools/tune_run_replay.c
# linked beside it, the model of PyTorch's expandable segments, the
# stand-in's cost table).
$(BUILD)/tests/test_tune_pickle: tools/pickle.c tools/pickle.h
$(BUILD)/tests/test_tune_snapshot $(BUILD)/tests/test_tune_recorded $(BUILD)/tests/test_tune_report: tools/pickle.c tools/tune_input.c tools/tune_input_report.c bench/trace.c $(wildcard tools/*.h) bench/trace.h
$(BUILD)/tests/test_tune_snapshot $(BUILD)/tests/test_tune_recorded $(BUILD)/tests/test_tune_report \
	$(BUILD)/tests/test_tune_bad_input: TEST_LINK := tools/tune_input_report.c
$(BUILD)/tests/test_tune_run: tools/tune_run.c tools/tune_run_replay.c tools/pt_expand.c bench/trace.c tests/standin/cost.c $(wildcard tools/*.h) bench/trace.h tests/standin/cost.h
$(BUILD)/tests/test_tune_run: TEST_LINK := tools/tune_run_replay.c
$(BUILD)/tests/test_tune_bad_input: $(TOOL_SRC) $(wildcard tools/*.h) bench/trace.h
# test_tune_output compiles tools/tune_output.c in (its picture writer and torch-version reader), with the stand-in's cost table.
$(BUILD)/tests/test_tune_output: tools/tune_output.c tools/tune.h tests/standin/cost.c tests/standin/cost.h
# test_expand_vs_pytorch replays as test_tune_run does, with bench/gen_trace.c linked beside it (its main left out).
$(BUILD)/tests/test_expand_vs_pytorch: tools/tune_run.c tools/tune_run_replay.c tools/pt_expand.c bench/trace.c bench/gen_trace.c tests/standin/cost.c $(wildcard tools/*.h) bench/trace.h tests/standin/cost.h
$(BUILD)/tests/test_expand_vs_pytorch: TEST_LINK := tools/tune_run_replay.c bench/gen_trace.c
$(BUILD)/tests/test_expand_vs_pytorch: CFLAGS += -DGEN_TRACE_NO_MAIN
# test_rmm_model compiles the model of RMM's pool in.
$(BUILD)/tests/test_rmm_model: tools/rmm_pool.c tools/rmm_pool.h bench/trace.c bench/trace.h
# test_tune_replay compiles the model of PyTorch's expandable segments in.
$(BUILD)/tests/test_tune_replay: tools/pt_expand.c tools/pt_expand.h bench/trace.c bench/trace.h

demo: $(BUILD)/bin/demo $(CLI)
	$(BUILD)/bin/demo

# Two private tags taking turns with a trainer on one device (docs/sleep.md).
demo-sleep: $(BUILD)/bin/demo-sleep $(CLI)
	$(BUILD)/bin/demo-sleep $(BUILD)/demo-sleep.json

# tests/run.sh prints one line per suite (a test binary, a Python test
# module, a check script): its name, N passed, N failed, N skipped and each
# skip's reason, with a failing suite's whole output; `make test` ends with
# the total "tests: N passed, N failed, N skipped" over its three parts.
# TEST_FILTER=summary runs the suites whose name contains summary;
# TEST_TIMEOUT bounds each suite (seconds); TEST_VERBOSE=1 shows all output.
TEST_RESULTS := $(BUILD)/test-results
test: export TEST_TOTAL := later
test: test-c test-py test-sh
	@bash tests/run.sh --total $(TEST_RESULTS)/c $(TEST_RESULTS)/py $(TEST_RESULTS)/sh
# LEFT_OUT (a pattern of test names) and LEFT_OUT_WHY: suites test-c does not run, said first (make tsan).
LEFT_OUT_TESTS = $(if $(LEFT_OUT),$(filter $(LEFT_OUT:%=$(BUILD)/tests/%),$(TESTS)))
test-c: $(TESTS) $(BUILD)/lib/libtally.so $(CLI) $(STANDIN_LIB)
	@bash tests/check_exports.sh $(BUILD)/lib/libtally.so
	$(if $(LEFT_OUT_TESTS),@echo "left out: $(notdir $(LEFT_OUT_TESTS)) ($(LEFT_OUT_WHY))")
	@$(STANDIN_ENV) BUILD=$(BUILD) TEST_RESULTS=$(TEST_RESULTS)/c bash tests/run.sh $(filter-out $(LEFT_OUT_TESTS),$(TESTS))
test-py: lib $(STANDIN_LIB)
	@$(STANDIN_ENV) TALLY_LIB=$(CURDIR)/$(BUILD)/lib/libtally.so PYTHONPATH=python TEST_RESULTS=$(TEST_RESULTS)/py bash tests/run.sh py:python/tests

# The shell-script checks: make install into a temporary PREFIX and DESTDIR
# (a pkg-config-built program runs without LD_LIBRARY_PATH, docs/api.md's
# static link line links, make uninstall leaves nothing), tools/setup.sh as
# a non-root user, tests/run.sh's own output, the demo's, and the figures
# the docs quote (tests/docs_figures.py).
test-sh: lib $(CLI) $(BUILD)/bin/demo $(BUILD)/bin/demo-sleep $(BUILD)/bench/rmm-pool-model
	@MAKE="$(MAKE)" BUILD=$(BUILD) TEST_RESULTS=$(TEST_RESULTS)/sh bash tests/run.sh \
		tests/check_install.sh tests/check_setup.sh tests/check_run.sh tests/check_demo.sh tests/check_demo_sleep.sh \
		tests/check_layers.sh tests/check_docs.sh tests/check_fuzz_replay.sh

# The model of RMM's pool, for the figure docs/benchmarks.md quotes from it
# (built by bench/Makefile, which make bench runs whole).
$(BUILD)/bench/rmm-pool-model: bench/rmm_pool.c tools/rmm_pool.c tools/rmm_pool.h bench/trace.c bench/trace.h \
		tests/standin/cost.c $(BUILD)/lib/libtally.a
	$(MAKE) -C bench BUILD=$(abspath $(BUILD)) $(abspath $(BUILD))/bench/rmm-pool-model

# ---- install ----
PREFIX       ?= /usr/local
DESTDIR      ?=
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
BINDIR       ?= $(PREFIX)/bin
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig

# tally.pc and tally-static.pc are written at install time, with this
# PREFIX. tally.pc's Libs carry an rpath, so a program linked with
# `pkg-config --libs tally` finds libtally.so.$(SOVERSION) without
# LD_LIBRARY_PATH; tally-static.pc links libtally.a and what it needs.
install: lib $(CLI)
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PKGCONFIGDIR) $(if $(CLI),$(DESTDIR)$(BINDIR))
	install -m 755 $(BUILD)/lib/libtally.so $(DESTDIR)$(LIBDIR)/libtally.so.$(VERSION)
	ln -sf libtally.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libtally.so.$(SOVERSION)
	ln -sf libtally.so.$(SOVERSION) $(DESTDIR)$(LIBDIR)/libtally.so
	install -m 644 $(BUILD)/lib/libtally.a $(DESTDIR)$(LIBDIR)/libtally.a
	install -m 644 include/tally.h $(DESTDIR)$(INCLUDEDIR)/tally.h
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
		'Name: tally' \
		'Description: caching GPU memory allocator with a ledger of every live block' \
		'Version: $(VERSION)' \
		'Cflags: -I$${includedir}' \
		'Libs: -L$${libdir} -Wl,-rpath,$${libdir} -ltally' \
		'Libs.private: $(LDLIBS)' > $(DESTDIR)$(PKGCONFIGDIR)/tally.pc
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
		'Name: tally-static' \
		'Description: tally linked statically (libtally.a and what it needs)' \
		'Version: $(VERSION)' \
		'Cflags: -I$${includedir}' \
		'Libs: $${libdir}/libtally.a $(LDLIBS)' > $(DESTDIR)$(PKGCONFIGDIR)/tally-static.pc
	$(if $(CLI),install -m 755 $(CLI) $(DESTDIR)$(BINDIR)/tally)

uninstall:
	rm -f $(DESTDIR)$(LIBDIR)/libtally.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libtally.so.$(SOVERSION) \
		$(DESTDIR)$(LIBDIR)/libtally.so $(DESTDIR)$(LIBDIR)/libtally.a $(DESTDIR)$(INCLUDEDIR)/tally.h \
		$(DESTDIR)$(PKGCONFIGDIR)/tally.pc $(DESTDIR)$(PKGCONFIGDIR)/tally-static.pc $(DESTDIR)$(BINDIR)/tally

bench: all $(STANDIN_LIB) | $(SETUP_BENCH)
	$(MAKE) -C bench BUILD=$(abspath $(BUILD))
	bash bench/run.sh $(abspath $(BUILD))

# make bench-quick (in .ci/run): every bench/ target built, every program run
# for a few seconds (bench/run.sh --quick), each table checked to be there.
.PHONY: bench-quick
bench-quick: all | $(SETUP_BENCH)
	$(MAKE) -C bench BUILD=$(abspath $(BUILD))
	bash bench/check_quick.sh $(abspath $(BUILD))

asan:
	$(MAKE) test-c BUILD=build-asan SAN="-fsanitize=address -fno-omit-frame-pointer" OPT=-O1
ubsan:
	$(MAKE) test-c BUILD=build-ubsan SAN="-fsanitize=undefined -fno-sanitize-recover=undefined" OPT=-O1
# Under ThreadSanitizer the suites of tally tune are left out, saying so:
# tools/ and the library start no thread (tune's workers are processes), so
# each of those processes has one thread and nothing for ThreadSanitizer to
# check, and they took about 700 of the step's 1,226 s in CI (2026-12-07).
# make test, asan and ubsan run them.
tsan:
	$(MAKE) test-c BUILD=build-tsan SAN="-fsanitize=thread" OPT=-O1 LEFT_OUT='test_tune_%' \
		LEFT_OUT_WHY="tally tune's suites: one thread per process, nothing for ThreadSanitizer to check"

clean:
	rm -rf build build-asan build-ubsan build-tsan build-aarch64 $(COV_BUILD)

# ---- aarch64 (GH200 and other ARM GPU nodes) ----
# make cross-aarch64   the library built with Debian's cross compilers
#                      (gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu) into
#                      build-aarch64/, then `file` must call both an ARM
#                      aarch64 ELF; .ci/run installs the compilers when root.
AARCH64_PREFIX ?= aarch64-linux-gnu-
.PHONY: cross-aarch64
cross-aarch64:
	@command -v $(AARCH64_PREFIX)gcc >/dev/null && command -v $(AARCH64_PREFIX)g++ >/dev/null || \
		{ echo "cross-aarch64: $(AARCH64_PREFIX)gcc / g++ not found; run: sudo apt-get install -y gcc-aarch64-linux-gnu g++-aarch64-linux-gnu" >&2; exit 1; }
	$(MAKE) lib BUILD=build-aarch64 CC=$(AARCH64_PREFIX)gcc CXX=$(AARCH64_PREFIX)g++ CUDA_HOME=/nonexistent
	@for f in build-aarch64/lib/libtally.so build-aarch64/obj/api/api.o; do \
		file -b $$f | grep -q 'ARM aarch64' || { echo "cross-aarch64: $$f is not an aarch64 ELF: $$(file -b $$f)" >&2; exit 1; }; \
		echo "cross-aarch64: $$f: $$(file -b $$f | cut -d, -f1-2)"; done

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
# 16 ended stages kept instead of 256 (lib/ledger/stage.h): the history is
# process-wide, and at 256 the JSON report fuzz_api parses back was 130 KB.
FUZZ_CFLAGS  += -DTALLY_STAGE_HISTORY=16
FUZZ_NAMES   := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_TARGETS ?= $(FUZZ_NAMES)
# lib/core/meta.c's private heap hides metadata overflows from ASan: the fuzz
# build takes its metadata from malloc instead (tests/fuzz/meta_malloc.c).
FUZZ_LIB_SRC := $(filter-out lib/core/meta.c,$(LIB_SRC)) tests/fuzz/meta_malloc.c
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

$(FUZZ_BUILD)/obj/%.o: %.c $(LIB_HDR) include/tally.h | $(FUZZ_OK)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_COVERAGE) $(FUZZ_SAN) -c $< -o $@

$(FUZZ_BUILD)/obj/lib/torch/torch_abi.o: FUZZ_CFLAGS += -fexceptions
# tree.c (the pools) and check.c (tally_check's recounts) are built without
# coverage instrumentation (ASan still checks them): their loops over bins,
# segments and ledger rows were a third of fuzz_api's time in comparison
# hooks, and their branches say nothing about the API's behaviour.
$(FUZZ_BUILD)/obj/lib/cache/tree.o: FUZZ_COVERAGE :=
$(FUZZ_BUILD)/obj/lib/cache/check.o: FUZZ_COVERAGE :=

$(FUZZ_BUILD)/libtally-fuzz.a: $(FUZZ_LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

# fuzz_api's parts (tests/fuzz/api_*.c, not targets of their own).
FUZZ_API_SRC := $(sort $(wildcard tests/fuzz/api_*.c))
FUZZ_SRC     := $(wildcard tests/fuzz/fuzz_*.c tests/fuzz/*.h) $(FUZZ_API_SRC)
# What a target links beside its own file: fuzz_api and fuzz_api_expand
# (which includes fuzz_api.c) fuzz_api's parts; fuzz_report (which includes
# tools/tally_cli.c) the command's pieces and tally tune's sources;
# fuzz_tune_input tally tune's sources.
FUZZ_LINK    :=
$(FUZZ_BUILD)/fuzz_api $(FUZZ_BUILD)/fuzz_api_expand $(BUILD)/fuzz-replay/fuzz_api \
	$(BUILD)/fuzz-replay/fuzz_api_expand: FUZZ_LINK := $(FUZZ_API_SRC)
$(FUZZ_BUILD)/fuzz_report $(BUILD)/fuzz-replay/fuzz_report: FUZZ_LINK := $(CLI_SRC) $(TOOL_SRC)
$(FUZZ_BUILD)/fuzz_tune_input $(BUILD)/fuzz-replay/fuzz_tune_input: FUZZ_LINK := $(TOOL_SRC)
$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_SRC) $(wildcard tools/*.h tools/*.c) $(FUZZ_BUILD)/libtally-fuzz.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(FUZZ_SAN) -o $@ $< $(FUZZ_LINK) $(FUZZ_BUILD)/libtally-fuzz.a -lpthread -ldl -lm

# Replay: the same targets with a plain main (tests/fuzz/replay_main.c),
# against the library of $(BUILD) (so `make asan` replays under ASan).
REPLAY_BINS := $(FUZZ_NAMES:%=$(BUILD)/fuzz-replay/%)
$(BUILD)/fuzz-replay/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/replay_main.c $(FUZZ_SRC) $(wildcard tools/*.h tools/*.c) $(BUILD)/lib/libtally.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Wno-pedantic -Itools -o $@ $< tests/fuzz/replay_main.c $(FUZZ_LINK) $(BUILD)/lib/libtally.a $(LDLIBS)

fuzz-replay: $(REPLAY_BINS)
	@bash tests/fuzz/replay.sh $(BUILD)/fuzz-replay $(FUZZ_NAMES)

test-c: fuzz-replay

.PHONY: clean-fuzz
clean-fuzz:
	rm -rf $(FUZZ_BUILD)
clean: clean-fuzz

# ---- mutation testing ----
# make mutate   applies each one-line mutation of tests/mutate/mutations.txt,
#               then MUTATE_BLIND (60) drawn by tests/mutate/blind.py with
#               MUTATE_SEED, to a scratch copy of the tree, runs what make
#               test runs, prints the survivors and both scores (minutes;
#               not part of .ci/run). MUTATE_ONLY=REGEX: matching entries only.
.PHONY: mutate
mutate: export MUTATE_ONLY := $(MUTATE_ONLY)
mutate: export MUTATE_BLIND := $(MUTATE_BLIND)
mutate: export MUTATE_SEED := $(MUTATE_SEED)
mutate:
	@nice -n 10 bash tests/mutate/mutate.sh

# ---- line coverage ----
# make coverage  make test on a build instrumented by gcov (build-cov, -O0;
#                every program links tests/mutate/gcov_exit.c, so forked
#                children that leave through _exit count too), then
#                tests/mutate/unexecuted.py: the blind candidates on lines no
#                test runs, by file and function, written to
#                build-cov/unexecuted.tsv. LDLIBS carries --coverage, so
#                the tally-static.pc that check_install links with names
#                libgcov, which an instrumented libtally.a needs. make
#                test's result is not the point here: what every suite ran
#                counts.
COV_BUILD := build-cov
.PHONY: coverage
coverage:
	@mkdir -p $(COV_BUILD)
	@find $(COV_BUILD) -name '*.gcda' -delete
	$(CC) -O0 -fPIC -c tests/mutate/gcov_exit.c -o $(COV_BUILD)/gcov_exit.o
	-$(MAKE) BUILD=$(COV_BUILD) OPT=-O0 SAN=--coverage \
		LDLIBS="$(LDLIBS) --coverage $(CURDIR)/$(COV_BUILD)/gcov_exit.o -Wl,--wrap=_exit" test
	python3 tests/mutate/unexecuted.py $(COV_BUILD)
