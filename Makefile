# megamoe build. `make` builds the static and the shared library, the tool,
# the tests, the benchmark and the example; `make test` builds and runs the
# CPU tests and the GPU tests (which skip, saying so, where no GPU is
# visible); `make gpu-test` runs only the GPU tests; `make install
# PREFIX=...` installs the header, both libraries and the pkg-config files;
# `make install-check` installs into a temporary folder and builds the
# example against it through pkg-config (no GPU needed). `make python` stages
# the shared library into the Python package (python/megamoe/lib/);
# `make python-install` also pip-installs the package (PYTHON, PIP_FLAGS).
#
# CUDA is found through CUDA_HOME; NCCL next to it (the CUDA include folder on
# the CPU machines) or in the system folders (the GPU machines). NCCL >= 2.28
# is required (symmetric memory windows, LSA pointers); the nccl.h the build
# uses is checked before anything is compiled.

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

# ---- NCCL version check (every goal but `clean`) ---------------------------
NCCL_MIN_MAJOR := 2
NCCL_MIN_MINOR := 28
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),all)),)
ifeq ($(wildcard $(NCCL_INC)/nccl.h),)
$(error NCCL not found: no nccl.h in NCCL_INC=$(NCCL_INC). megamoe needs NCCL >= $(NCCL_MIN_MAJOR).$(NCCL_MIN_MINOR) (symmetric memory windows, LSA pointers): install it, or point NCCL_INC and NCCL_LIB at it)
endif
NCCL_FOUND := $(shell awk '$$2 == "NCCL_MAJOR" { a = $$3 } $$2 == "NCCL_MINOR" { b = $$3 } $$2 == "NCCL_PATCH" { c = $$3 } END { print a + 0, b + 0, c + 0 }' $(NCCL_INC)/nccl.h)
NCCL_OK := $(shell test $(word 1,$(NCCL_FOUND)) -gt $(NCCL_MIN_MAJOR) -o \( $(word 1,$(NCCL_FOUND)) -eq $(NCCL_MIN_MAJOR) -a $(word 2,$(NCCL_FOUND)) -ge $(NCCL_MIN_MINOR) \) && echo yes)
ifneq ($(NCCL_OK),yes)
$(error NCCL $(subst $() ,.,$(NCCL_FOUND)) in $(NCCL_INC)/nccl.h is too old: megamoe needs NCCL >= $(NCCL_MIN_MAJOR).$(NCCL_MIN_MINOR) (symmetric memory windows, LSA pointers); point NCCL_INC and NCCL_LIB at a newer one)
endif
endif

# ---- Flags -----------------------------------------------------------------
BUILD   ?= build
ARCH    ?= -gencode=arch=compute_90a,code=sm_90a
# Include paths by tree: the library (src/, ref/) sees only its own folders;
# tests add tests/, the tool and the benchmark add bench/, the example sees
# only the public header (as a user's program does).
DEP_INCS   := -I$(CUDA_HOME)/include $(if $(filter $(CUDA_HOME)/include,$(NCCL_INC)),,-I$(NCCL_INC))
LIB_INCS   := -Iinclude -Isrc -Isrc/device -Iref
EXTRA_INCS :=
INCS        = $(LIB_INCS) $(EXTRA_INCS) $(DEP_INCS)
$(BUILD)/tests/%.o: EXTRA_INCS := -Itests
$(BUILD)/tests/unit/test_soak.o $(BUILD)/tests/unit/test_clocks.o: EXTRA_INCS := -Itests -Ibench
$(BUILD)/bench/%.o $(BUILD)/tools/%.o: EXTRA_INCS := -Ibench
$(BUILD)/examples/%.o: LIB_INCS := -Iinclude

# Every object is position-independent: the same objects make both libraries.
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -fPIC -Wall -Wextra -Wno-unused-parameter -Werror=implicit-function-declaration -MMD -MP
NVFLAGS ?= -O3 -lineinfo
NVFLAGS += -std=c++17 $(ARCH) -Xcompiler -fPIC -Xcompiler -Wall -MMD -MP --expt-relaxed-constexpr
ifneq ($(PTXAS_VERBOSE),)
NVFLAGS += -Xptxas -v
endif
DEP_LIBDIRS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
               $(if $(filter $(CUDA_HOME)/lib64,$(NCCL_LIB)),,-L$(NCCL_LIB) -Wl,-rpath,$(NCCL_LIB))
# What the library itself needs (the shared library links exactly these).
LIB_LDLIBS  := $(DEP_LIBDIRS) -lnccl -lcudart -lpthread -lstdc++ -lm
# Programs linked with the static library (the benchmark and the GEMM tests
# also use cuBLASLt).
LDLIBS      := $(DEP_LIBDIRS) -lnccl -lcublasLt -lcudart -lpthread -lm -ldl -lstdc++

# ---- Sources and outputs ---------------------------------------------------
HOST_SRC   := $(shell find src/host -name '*.c' | sort)
DEVICE_SRC := $(shell find src/device -name '*.cu' | sort)
REF_SRC    := $(shell find ref -name '*.c' | sort)
LIB_OBJ    := $(HOST_SRC:%.c=$(BUILD)/%.o) $(DEVICE_SRC:%.cu=$(BUILD)/%.o) $(REF_SRC:%.c=$(BUILD)/%.o)
LIB        := $(BUILD)/libmegamoe.a

MM_MAJOR   := $(shell awk '$$2 == "MEGAMOE_VERSION_MAJOR" { print $$3 }' include/megamoe.h)
MM_MINOR   := $(shell awk '$$2 == "MEGAMOE_VERSION_MINOR" { print $$3 }' include/megamoe.h)
SONAME     := libmegamoe.so.$(MM_MAJOR)
SO_FILE    := libmegamoe.so.$(MM_MAJOR).$(MM_MINOR)
SO         := $(BUILD)/$(SO_FILE)
SO_MAP     := $(BUILD)/megamoe.map

# The unit tests also run the pure-host parts of the GPU fuzz and of the
# fault tests (their checks, on planted bugs).
UNIT_SRC   := $(shell find tests/unit -name '*.c' | sort) tests/gpu/fuzz_check.c tests/faults/fault_judge.c
GPU_TEST_SRC := $(shell find tests/gpu -name '*.c' -o -name '*.cu' | sort)
FAULT_SRC  := $(shell find tests/faults -name '*.c' | sort)
BENCH_SRC  := $(shell find bench -name '*.c' -o -name '*.cu' | sort)
TOOL_SRC   := tools/megamoe.c
EXAMPLE_SRC := $(shell find examples -name '*.c' | sort)

UNIT_BIN   := $(BUILD)/unit_tests
GPU_BIN    := $(BUILD)/gpu_tests
FAULT_BIN  := $(BUILD)/fault_tests
TOOL_BIN   := $(BUILD)/megamoe
EXAMPLE_BIN := $(EXAMPLE_SRC:%.c=$(BUILD)/%)

PREFIX       ?= /usr/local
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig

.PHONY: all test unit-test gpu-test gpu-test-colocated sanitize soak faults install install-check fuzz-sanitized clean python python-install
all: $(LIB) $(SO) $(UNIT_BIN) $(GPU_BIN) $(FAULT_BIN) $(TOOL_BIN) $(EXAMPLE_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(INCS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) $(INCS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# The shared library exports the public API (megamoe_*) and nothing else.
$(SO_MAP):
	@mkdir -p $(dir $@)
	printf '{\n  global: megamoe_*;\n  local: *;\n};\n' > $@

$(SO): $(LIB_OBJ) $(SO_MAP)
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,--version-script=$(SO_MAP) -Wl,--no-undefined -Wl,--as-needed \
	  $(LIB_OBJ) $(LIB_LDLIBS) -o $@
	ln -sf $(SO_FILE) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $(BUILD)/libmegamoe.so

# The unit tests also check the soak's options and per-call draw and the
# bench's clock sampler (plain C).
UNIT_BENCH_OBJ := $(BUILD)/bench/soak_draw.o $(BUILD)/bench/cli.o $(BUILD)/bench/bench_clocks.o
$(UNIT_BIN): $(UNIT_SRC:%.c=$(BUILD)/%.o) $(UNIT_BENCH_OBJ) $(LIB)
	$(CC) $(filter %.o,$^) $(LIB) $(LDLIBS) -o $@

GPU_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(patsubst %.c,$(BUILD)/%.o,$(GPU_TEST_SRC)))
$(GPU_BIN): $(GPU_OBJ) $(LIB)
	$(CC) $(GPU_OBJ) $(LIB) $(LDLIBS) -o $@

# The fault tests share the GPU tests' problem builder (layer_case.c).
FAULT_OBJ := $(FAULT_SRC:%.c=$(BUILD)/%.o) $(BUILD)/tests/gpu/layer_case.o
$(FAULT_BIN): $(FAULT_OBJ) $(LIB)
	$(CC) $(FAULT_OBJ) $(LIB) $(LDLIBS) -o $@

BENCH_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(patsubst %.c,$(BUILD)/%.o,$(BENCH_SRC)))
$(TOOL_BIN): $(BUILD)/tools/megamoe.o $(BENCH_OBJ) $(LIB)
	$(CC) $(BUILD)/tools/megamoe.o $(BENCH_OBJ) $(LIB) $(LDLIBS) -o $@

# The example links the shared library, as a user's program would.
$(EXAMPLE_BIN): $(BUILD)/examples/%: $(BUILD)/examples/%.o $(SO)
	$(CC) $< -L$(BUILD) -Wl,-rpath,'$$ORIGIN/..' -lmegamoe $(DEP_LIBDIRS) -lcudart -lnccl -lm -o $@

unit-test: $(UNIT_BIN) $(TOOL_BIN)
	$(UNIT_BIN)

# The Python interpreter of the Python tests and of python-install.
PYTHON ?= python3
export PYTHON

# Every GPU test: the C suites, then the Python package's (python/tests/gpu:
# torch + torch.distributed, EP1 and EP2; they skip without torch or GPUs),
# then the fault tests.
gpu-test: $(GPU_BIN) $(FAULT_BIN) $(SO)
	tests/run_tests.sh $(BUILD) gpu

# The multi-rank layer suites co-located on one GPU (host/colocated.h: a
# process and CUDA context per rank, no NCCL, peer buffers through CUDA IPC;
# the protocols of EP2, no NVLink and no timing): where fewer GPUs are
# visible than COLOCATED_RANKS (default 2), those rank counts run on GPU 0
# instead of being skipped. FILTER: the runner's name filter (empty: all).
COLOCATED_RANKS ?= 2
gpu-test-colocated: $(GPU_BIN)
	MEGAMOE_TEST_COLOCATED=1 MEGAMOE_TEST_RANKS=$(COLOCATED_RANKS) $(GPU_BIN) '$(FILTER)'

# Fault tests alone (tests/faults: killed, silent and misconfigured ranks at
# EP2 with a 1 s deadline; they skip, saying so, with fewer than 2 GPUs).
faults: $(FAULT_BIN)
	NCCL_NVLS_ENABLE=0 $(FAULT_BIN)

# CPU tests (they also run the tool), the GPU tests (they skip where no GPU
# is visible), and the Python package's tests (python/tests; skipped, saying
# so, where PYTHON lacks numpy or pytest, unless
# MEGAMOE_REQUIRE_PYTHON_TESTS=1).
test: $(UNIT_BIN) $(GPU_BIN) $(FAULT_BIN) $(TOOL_BIN) $(SO)
	tests/run_tests.sh $(BUILD)

# ---- Reliability (docs/RELIABILITY.md; GPU machines) ----------------------------
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over the GEMM
# engine tests and the layer's "sanitize small" tests at EP1 and EP2 on each
# arm, each tool's planted-bug control first. TOOLS and TARGETS pick a subset
# (comma-separated: memcheck,racecheck,synccheck,initcheck;
# control,gemm,staged,split,fused); SANITIZE_DIR holds the logs (BUILD/sanitize),
# SANITIZE_TIMEOUT bounds each run (400 s).
sanitize: $(GPU_BIN)
	scripts/sanitize.sh --build $(BUILD) --tools "$(TOOLS)" --targets "$(TARGETS)"

# The soak on every visible GPU: `megamoe soak` with SOAK_ARGS (its --help).
soak: $(TOOL_BIN)
	NCCL_NVLS_ENABLE=0 $(TOOL_BIN) soak $(SOAK_ARGS)

# ---- Python package (python/) -----------------------------------------------
# `make python` copies the shared library into the package, where the package
# finds it once installed; `make python-install` then pip-installs python/
# into PYTHON's environment (offline: PIP_FLAGS=--no-build-isolation, with
# setuptools installed).
PY_LIB := python/megamoe/lib/$(SONAME)
python: $(PY_LIB)
$(PY_LIB): $(SO)
	@mkdir -p $(dir $@)
	cp -f $(SO) $@

python-install: $(PY_LIB)
	$(PYTHON) -m pip install $(PIP_FLAGS) ./python

# The config/layout fuzz (tests/unit/test_fuzz.c) and the fused arm's schedule
# tests (tests/unit/test_fused.c: the stream decode and ring simulation of
# src/fused.h) built on their own with AddressSanitizer and
# UndefinedBehaviorSanitizer over the host sources they run; CI runs it after
# the tests.
FUZZ_SAN_SRC := src/host/config.c src/host/layout.c src/host/fused_plan.c src/host/errors.c src/host/device_status.c \
                tests/unit/test_fuzz.c tests/unit/test_fused.c tests/sanitize/fuzz_main.c
FUZZ_SAN_BIN := $(BUILD)/fuzz_sanitized
$(FUZZ_SAN_BIN): $(FUZZ_SAN_SRC)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
	  -fno-omit-frame-pointer $(LIB_INCS) -Itests $(DEP_INCS) $(FUZZ_SAN_SRC) -lm -o $@
fuzz-sanitized: $(FUZZ_SAN_BIN)
	$(FUZZ_SAN_BIN)

# ---- Install ---------------------------------------------------------------
# megamoe.pc links the shared library; megamoe-static.pc the static one.
# Both carry the CUDA runtime and NCCL: the public header uses their types and
# every caller calls them (cudaSetDevice, ncclGetUniqueId).
PC_CFLAGS := $(strip -I$(INCLUDEDIR) $(DEP_INCS))
PC_LIBS   := $(strip -L$(CUDA_HOME)/lib64 $(if $(filter $(CUDA_HOME)/lib64,$(NCCL_LIB)),,-L$(NCCL_LIB)) -lcudart -lnccl)
define pc_file
	{ echo 'prefix=$(PREFIX)'; echo 'libdir=$(LIBDIR)'; echo 'includedir=$(INCLUDEDIR)'; echo; \
	  echo 'Name: $(1)'; \
	  echo 'Description: Expert-parallel FP8 Mixture-of-Experts layer for Hopper GPUs ($(2) library)'; \
	  echo 'Version: $(MM_MAJOR).$(MM_MINOR)'; \
	  echo 'Cflags: $(PC_CFLAGS)'; \
	  echo 'Libs: $(3) $(PC_LIBS)'; \
	  echo 'Libs.private: $(4)'; } > $(DESTDIR)$(PKGCONFIGDIR)/$(1).pc
endef

install: $(LIB) $(SO)
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR)
	install -m 644 include/megamoe.h $(DESTDIR)$(INCLUDEDIR)/megamoe.h
	install -m 644 $(LIB) $(DESTDIR)$(LIBDIR)/libmegamoe.a
	install -m 755 $(SO) $(DESTDIR)$(LIBDIR)/$(SO_FILE)
	ln -sf $(SO_FILE) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libmegamoe.so
	$(call pc_file,megamoe,shared,-L$${libdir} -lmegamoe,-lpthread -lstdc++ -lm)
	$(call pc_file,megamoe-static,static,$${libdir}/libmegamoe.a -lpthread -lstdc++ -lm,)

# Installs into a temporary folder, builds the example against the installed
# tree through pkg-config (shared and static), checks what each binary loads,
# and runs both with the GPUs hidden: each must say so and exit 77.
install-check: $(LIB) $(SO)
	@set -e; d=$$(mktemp -d); trap 'rm -rf "$$d"' EXIT; \
	$(MAKE) --no-print-directory install PREFIX="$$d" > "$$d/install.log"; \
	export PKG_CONFIG_PATH="$$d/lib/pkgconfig"; \
	for ex in $(EXAMPLE_SRC); do \
	  b="$$d/$$(basename $$ex .c)"; \
	  $(CC) -std=c11 -Wall -Wextra -Werror $$ex $$(pkg-config --cflags --libs megamoe) -lm \
	    -Wl,-rpath,"$$d/lib" -o "$$b"; \
	  $(CC) -std=c11 -Wall -Wextra -Werror $$ex $$(pkg-config --cflags --libs megamoe-static) -lm -o "$$b-static"; \
	  ldd "$$b" | grep -q "$$d/lib/$(SONAME)" || { echo "install-check: $$b does not load $$d/lib/$(SONAME)"; exit 1; }; \
	  if ldd "$$b-static" | grep -q libmegamoe; then echo "install-check: $$b-static loads libmegamoe"; exit 1; fi; \
	  for x in "$$b" "$$b-static"; do \
	    rc=0; CUDA_VISIBLE_DEVICES= "$$x" > "$$d/out" 2>&1 || rc=$$?; \
	    if [ $$rc -ne 77 ] || ! grep -q "no CUDA GPU" "$$d/out"; then \
	      echo "install-check: $$x without a GPU: exit $$rc (want 77)"; cat "$$d/out"; exit 1; fi; \
	  done; \
	done; \
	echo "install-check: installed into a temporary PREFIX, built $(notdir $(EXAMPLE_BIN)) through pkg-config (megamoe, megamoe-static), ran them without a GPU: OK"

clean:
	rm -rf $(BUILD) python/megamoe/lib python/build python/megamoe.egg-info

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
