# The CUDA stand-in (tests/standin/): a libcuda.so.1 on host memory that the
# C and Python tests load through LD_LIBRARY_PATH (see the Makefile's test-c
# and test-py). It needs no CUDA toolkit: lib/backend/cuda/driver.h declares
# everything. docs/standin.md says what it models.
STANDIN_SRC := $(sort $(wildcard tests/standin/*.c))
STANDIN_OBJ := $(STANDIN_SRC:tests/standin/%.c=$(BUILD)/standin/obj/%.o)
STANDIN_LIB := $(BUILD)/standin/libcuda.so.1

$(BUILD)/standin/obj/%.o: tests/standin/%.c tests/standin/standin.h tests/standin/cost.h lib/backend/cuda/driver.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

$(STANDIN_LIB): $(STANDIN_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared $(SAN) -fPIC -Wl,-soname,libcuda.so.1 -o $@ $(STANDIN_OBJ) -lpthread

.PHONY: standin
standin: $(STANDIN_LIB)

# Run a test command with the stand-in first on the library search path,
# unless TALLY_REAL_CUDA=1 (a GPU machine: the real driver).
STANDIN_ENV = $(if $(filter 1,$(TALLY_REAL_CUDA)),,LD_LIBRARY_PATH=$(CURDIR)/$(BUILD)/standin$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH})
