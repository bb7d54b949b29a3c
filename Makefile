# megamoe build. `make` builds the library, the tool, the tests and the
# benchmark; `make test` builds and runs the CPU tests and the GPU tests
# (which skip, saying so, where no GPU is visible); `make gpu-test` runs only
# the GPU tests.
#
# CUDA is found through CUDA_HOME; NCCL next to it (the CUDA include folder on
# the CPU machines) or in the system folders (the GPU machines).

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CC        ?= gcc
ifeq ($(origin CC),default)
CC := gcc
endif

ifneq ($(wildcard $(CUDA_HOME)/include/nccl.h),)
NCCL_INC ?= $(CUDA_HOME)/include
else
NCCL_INC ?= /usr/include
endif
ifneq ($(wildcard $(CUDA_HOME)/lib64/libnccl.so),)
NCCL_LIB ?= $(CUDA_HOME)/lib64
else
NCCL_LIB ?= /usr/lib/x86_64-linux-gnu
endif

BUILD   ?= build
ARCH    ?= -gencode=arch=compute_90a,code=sm_90a
INCS    := -Iinclude -Isrc -Isrc/device -Iref -Itests -Ibench -I$(CUDA_HOME)/include -I$(NCCL_INC)
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Werror=implicit-function-declaration $(INCS) -MMD -MP
NVFLAGS ?= -O3 -lineinfo
NVFLAGS += -std=c++17 $(ARCH) $(INCS) -Xcompiler -Wall -MMD -MP --expt-relaxed-constexpr
ifneq ($(PTXAS_VERBOSE),)
NVFLAGS += -Xptxas -v
endif
LDLIBS  := -L$(CUDA_HOME)/lib64 -L$(NCCL_LIB) -Wl,-rpath,$(CUDA_HOME)/lib64 -Wl,-rpath,$(NCCL_LIB) \
           -lnccl -lcublasLt -lcudart -lpthread -lm -ldl -lstdc++

HOST_SRC   := $(shell find src/host -name '*.c' | sort)
DEVICE_SRC := $(shell find src/device -name '*.cu' | sort)
REF_SRC    := $(shell find ref -name '*.c' | sort)
LIB_OBJ    := $(HOST_SRC:%.c=$(BUILD)/%.o) $(DEVICE_SRC:%.cu=$(BUILD)/%.o) $(REF_SRC:%.c=$(BUILD)/%.o)
LIB        := $(BUILD)/libmegamoe.a

UNIT_SRC   := $(shell find tests/unit -name '*.c' | sort)
GPU_TEST_SRC := $(shell find tests/gpu -name '*.c' -o -name '*.cu' | sort)
BENCH_SRC  := $(shell find bench -name '*.c' -o -name '*.cu' | sort)
TOOL_SRC   := tools/megamoe.c

UNIT_BIN   := $(BUILD)/unit_tests
GPU_BIN    := $(BUILD)/gpu_tests
TOOL_BIN   := $(BUILD)/megamoe

.PHONY: all test unit-test gpu-test clean info
all: $(LIB) $(UNIT_BIN) $(GPU_BIN) $(TOOL_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(UNIT_BIN): $(UNIT_SRC:%.c=$(BUILD)/%.o) $(LIB)
	$(CC) $(filter %.o,$^) $(LIB) $(LDLIBS) -o $@

GPU_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(patsubst %.c,$(BUILD)/%.o,$(GPU_TEST_SRC)))
$(GPU_BIN): $(GPU_OBJ) $(LIB)
	$(CC) $(GPU_OBJ) $(LIB) $(LDLIBS) -o $@

BENCH_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(patsubst %.c,$(BUILD)/%.o,$(BENCH_SRC)))
$(TOOL_BIN): $(BUILD)/tools/megamoe.o $(BENCH_OBJ) $(LIB)
	$(CC) $(BUILD)/tools/megamoe.o $(BENCH_OBJ) $(LIB) $(LDLIBS) -o $@

unit-test: $(UNIT_BIN)
	$(UNIT_BIN)

gpu-test: $(GPU_BIN)
	NCCL_NVLS_ENABLE=0 $(GPU_BIN)

# CPU tests, then the GPU tests (they skip where no GPU is visible).
test: $(UNIT_BIN) $(GPU_BIN) $(TOOL_BIN)
	tests/run_tests.sh $(BUILD)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
