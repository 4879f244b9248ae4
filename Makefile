# rkv — the one makefile.
#   make            every binary into build/bin, libraries under build/
#   make test       every test that needs no GPU; ends with "N passed, N failed"
#   make asan       unit tests under AddressSanitizer + UBSan (build/asan)
#   make valgrind   unit tests under valgrind memcheck
#   make fuzz       every libFuzzer target for FUZZ_SECONDS each (build/fuzz)
#   make gpu        the gpu op tests and benchmark (tests/gpu) into build/gpu; needs
#                   nvcc and the CUDA libraries only, not scripts/deps.sh's packages
#   make run        rkvd on the CPU backend with a generated model, 127.0.0.1:8080
#   make CUDA=0     CPU-only build (CUDA is used when nvcc is found)
#
# layout: each component folder (common proto worker kvmgr daemon) becomes
# build/lib/librkv_<name>.a from every .c that is not main.c or *_test.c;
# <folder>/main.c becomes that process's binary; cli/<tool>/*.c becomes
# build/bin/<tool>; every *_test.c becomes build/test/<name>, linked with all
# libraries and cmocka.

BUILD      ?= build
CC         ?= cc
FUZZ_SECONDS ?= 20
SAN        ?= 0
FUZZ       ?= 0

NVCC_FOUND := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(origin CUDA),undefined)
  CUDA := $(if $(NVCC_FOUND),1,0)
endif
NVCC       ?= $(NVCC_FOUND)
CUDA_HOME  ?= $(if $(NVCC_FOUND),$(patsubst %/bin/nvcc,%,$(NVCC_FOUND)),/usr/local/cuda)

# x86-64-v3 (avx2+fma+f16c) when this cpu has it; the cpu backend's loops
# are written to vectorize
ARCHFLAGS  ?= $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && grep -qw fma /proc/cpuinfo && echo -march=x86-64-v3)
OPT        ?= -O2
WARN       := -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Wno-format-truncation \
              -Werror=implicit-function-declaration -Werror=incompatible-pointer-types \
              -Werror=int-conversion -Werror=return-type
CPPFLAGS   += -I. -D_GNU_SOURCE -MMD -MP
CFLAGS     ?= $(OPT) -g
CFLAGS     += -std=c11 -pthread $(WARN) $(ARCHFLAGS) -fno-strict-aliasing
LDLIBS     := -lnng -luv -lcjson -lsqlite3 -lsystemd -lpcre2-8 -lhttp_parser -lcrypto -lm -lpthread -ldl -lrt

ifeq ($(SAN),1)
  CFLAGS   += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDFLAGS  += -fsanitize=address,undefined
  CUDA     := 0
endif
ifeq ($(FUZZ),1)
  CC       := clang
  CFLAGS   += -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -DRKV_FUZZING=1
  LDFLAGS  += -fsanitize=address,undefined
  CUDA     := 0
endif
# cudart static so a binary starts on a machine without the driver;
# cublas is loaded from the toolkit
CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
               -lcublasLt -lcublas -lcudart_static -lstdc++
ifeq ($(CUDA),1)
  CPPFLAGS += -DRKV_CUDA=1
  NVFLAGS  := -O3 -g -std=c++17 -I. -Xcompiler -fPIC,-Wall \
              -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
  LDLIBS   += $(CUDA_LDLIBS)
endif

# the configuration this build folder holds, one line in $(BUILD)/config: an
# object or program built under another configuration is rebuilt, so
# `make CUDA=0` then `make` in one folder never mixes the two
CONFIG_LINE := CC=$(CC) CUDA=$(CUDA) SAN=$(SAN) FUZZ=$(FUZZ) CPPFLAGS=$(CPPFLAGS) CFLAGS=$(CFLAGS) \
               LDFLAGS=$(LDFLAGS) LDLIBS=$(LDLIBS) NVCC=$(if $(filter 1,$(CUDA)),$(NVCC)) NVFLAGS=$(NVFLAGS)
CONFIG     := $(BUILD)/config

COMPONENTS := common proto worker kvmgr daemon
# link order: dependents first
LINK_ORDER := daemon kvmgr worker proto common

findc = $(shell find $(1) -name '*.c' 2>/dev/null | sort)
libsrc = $(filter-out %_test.c $(1)/main.c,$(call findc,$(1)))
obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

$(foreach c,$(COMPONENTS),$(eval SRC_$(c) := $(call libsrc,$(c))))
CU_SRC     := $(if $(filter 1,$(CUDA)),$(shell find worker/cuda -name '*.cu' 2>/dev/null | sort))
CU_OBJ     := $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CU_SRC))
LIBS       := $(foreach c,$(LINK_ORDER),$(BUILD)/lib/librkv_$(c).a)
# what each component may use (the layering of docs/runtime.md); cli tools and
# tests/unit use everything
USES_common := common
USES_proto  := proto common
USES_worker := worker proto common
USES_kvmgr  := kvmgr proto common
USES_daemon := daemon proto common
libs_of = $(foreach c,$(LINK_ORDER),$(if $(filter $(c),$(USES_$(1))),$(BUILD)/lib/librkv_$(c).a))
# component of a source path: its first folder
comp_of = $(firstword $(subst /, ,$(1)))
test_libs = $(if $(filter $(COMPONENTS),$(call comp_of,$(1))),$(call libs_of,$(call comp_of,$(1))),$(LIBS))

PROC_BINS  := $(if $(wildcard daemon/main.c),$(BUILD)/bin/rkvd) \
              $(if $(wildcard kvmgr/main.c),$(BUILD)/bin/rkv-kvmgr) \
              $(if $(wildcard worker/main.c),$(BUILD)/bin/rkv-worker)
CLI_TOOLS  := $(notdir $(patsubst %/,%,$(sort $(dir $(wildcard cli/*/*.c)))))
CLI_BINS   := $(addprefix $(BUILD)/bin/,$(CLI_TOOLS))
BINS       := $(PROC_BINS) $(CLI_BINS)

TEST_SRC   := $(shell find $(COMPONENTS) cli tests/unit -name '*_test.c' 2>/dev/null | sort)
TEST_BINS  := $(addprefix $(BUILD)/test/,$(notdir $(TEST_SRC:.c=)))
FUZZ_SRC   := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS  := $(addprefix $(BUILD)/fuzz-bin/,$(notdir $(FUZZ_SRC:.c=)))

# the engine: the common and worker code that includes no header of a library
# scripts/deps.sh installs (nng, uv, cjson, sqlite, pcre2, ...), so it builds
# and links with libc and CUDA alone
EXT_HEADERS := nng/|uv\.h|cjson/|sqlite3\.h|pcre2\.h|systemd/|http_parser\.h|openssl/|cmocka\.h
ENGINE_SRC := $(shell grep -L -E '^\s*\#\s*include\s*<($(EXT_HEADERS))' $(SRC_common) $(SRC_worker))
# tests/gpu: each program is its main file, the rest of the folder its helpers
GPU_PROGS  := gpu_ops_test gpu_bench
GPU_HELPER_SRC := $(filter-out $(addprefix tests/gpu/,$(addsuffix .c,$(GPU_PROGS))),$(wildcard tests/gpu/*.c))
GPU_BINS   := $(addprefix $(BUILD)/gpu/,$(GPU_PROGS))

DEPS_STAMP := $(BUILD)/.deps-ok

.PHONY: all test unit-test py-test asan valgrind fuzz fuzz-build run clean format \
        gpu gpu-test bench deps venv
.DEFAULT_GOAL := all

all: $(DEPS_STAMP) $(BINS)

# debian packages: checked once per build tree, installed by scripts/deps.sh
$(DEPS_STAMP): scripts/deps.sh
	@scripts/deps.sh
	@mkdir -p $(@D) && touch $@
deps: $(DEPS_STAMP)
venv: $(DEPS_STAMP)
	@scripts/deps.sh --venv

# rewritten only when the configuration changes, so its time says when
$(CONFIG): FORCE
	@mkdir -p $(@D)
	@if [ "$$(cat $@ 2>/dev/null)" != '$(CONFIG_LINE)' ]; then \
	    [ -f $@ ] && echo "$(BUILD): the configuration changed; rebuilding"; \
	    echo '$(CONFIG_LINE)' >$@; fi
.PHONY: FORCE
FORCE:

$(BUILD)/obj/%.o: %.c $(CONFIG)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@
# every object but the engine's and tests/gpu's waits for the deps stamp
# (order-only), so the libraries' headers exist first
$(call obj,$(filter-out $(ENGINE_SRC) tests/gpu/%,$(call findc,$(COMPONENTS) cli tests))): | $(DEPS_STAMP)
# cupti's header, where the toolkit has it (gpu_trace.c)
$(call obj,$(wildcard tests/gpu/*.c)): CPPFLAGS += -I$(CUDA_HOME)/include

$(BUILD)/obj/%.cu.o: %.cu $(CONFIG)
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -DRKV_CUDA=1 -MMD -MP -c $< -o $@

define lib_rule
$(BUILD)/lib/librkv_$(1).a: $(call obj,$(SRC_$(1))) $(if $(filter worker,$(1)),$(CU_OBJ))
	@mkdir -p $$(@D)
	@rm -f $$@
	ar rcs $$@ $$^
endef
$(foreach c,$(COMPONENTS),$(eval $(call lib_rule,$(c))))

$(BUILD)/lib/librkv_engine.a: $(call obj,$(ENGINE_SRC)) $(CU_OBJ)
$(BUILD)/lib/librkv_gpu_helpers.a: $(call obj,$(GPU_HELPER_SRC))
$(BUILD)/lib/librkv_engine.a $(BUILD)/lib/librkv_gpu_helpers.a:
	@mkdir -p $(@D)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/bin/rkvd: $(BUILD)/obj/daemon/main.o $(call libs_of,daemon)
$(BUILD)/bin/rkv-kvmgr: $(BUILD)/obj/kvmgr/main.o $(call libs_of,kvmgr)
$(BUILD)/bin/rkv-worker: $(BUILD)/obj/worker/main.o $(call libs_of,worker)
$(PROC_BINS): $(CONFIG)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $(CFLAGS) $(filter %.o,$^) $(filter %.a,$^) $(LDLIBS) -o $@

define cli_rule
$(BUILD)/bin/$(1): $(call obj,$(filter-out %_test.c,$(wildcard cli/$(1)/*.c))) $(LIBS) $(CONFIG)
	@mkdir -p $$(@D)
	$(CC) $(LDFLAGS) $(CFLAGS) $$(filter %.o,$$^) $(LIBS) $(LDLIBS) -o $$@
endef
$(foreach t,$(CLI_TOOLS),$(eval $(call cli_rule,$(t))))

define test_rule
$(BUILD)/test/$(notdir $(1:.c=)): $(call obj,$(1)) $(call test_libs,$(1)) $(CONFIG)
	@mkdir -p $$(@D)
	$(CC) $(LDFLAGS) $(CFLAGS) $$(filter %.o,$$^) $$(filter %.a,$$^) -lcmocka $(LDLIBS) -o $$@
endef
$(foreach t,$(TEST_SRC),$(eval $(call test_rule,$(t))))

define fuzz_rule
$(BUILD)/fuzz-bin/$(notdir $(1:.c=)): $(call obj,$(1)) $(LIBS) $(CONFIG)
	@mkdir -p $$(@D)
	$(CC) $(CFLAGS) -fsanitize=fuzzer,address,undefined $$(filter %.o,$$^) $$(filter %.a,$$^) $(LDLIBS) -o $$@
endef
$(foreach t,$(FUZZ_SRC),$(eval $(call fuzz_rule,$(t))))

# the gpu programs: no deps stamp and no library but CUDA's
ifeq ($(CUDA),1)
gpu: $(GPU_BINS)
else
gpu:
	@echo "make gpu: needs CUDA (nvcc not found, or CUDA=0)" >&2; exit 1
endif
$(BUILD)/gpu/%: $(BUILD)/obj/tests/gpu/%.o $(BUILD)/lib/librkv_gpu_helpers.a \
                $(BUILD)/lib/librkv_engine.a $(CONFIG)
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) $(CFLAGS) $(filter %.o,$^) $(filter %.a,$^) $(CUDA_LDLIBS) -lm -lpthread -ldl -lrt -o $@

# --- tests -------------------------------------------------------------------

# unit tests (cmocka) then the python tests (real processes, numpy, openai)
test: all $(TEST_BINS) venv
	@RKV_BUILD=$(BUILD) scripts/run-tests.sh --unit $(TEST_BINS) --py tests

unit-test: all $(TEST_BINS)
	@RKV_BUILD=$(BUILD) scripts/run-tests.sh --unit $(TEST_BINS)

asan:
	@$(MAKE) --no-print-directory BUILD=build/asan SAN=1 CUDA=0 unit-test

valgrind: all $(TEST_BINS)
	@RKV_BUILD=$(BUILD) RKV_VALGRIND=1 scripts/run-tests.sh --unit $(TEST_BINS)

fuzz-build: $(FUZZ_BINS)

fuzz:
	@$(MAKE) --no-print-directory BUILD=build/fuzz FUZZ=1 CUDA=0 fuzz-build
	@scripts/run-fuzz.sh build/fuzz/fuzz-bin $(FUZZ_SECONDS)

# --- installing ----------------------------------------------------------------

# make install [PREFIX=/usr/local] [DESTDIR=]; make deb -> $(BUILD)/rkv_VERSION_ARCH.deb
.PHONY: install deb
install: all
	@scripts/install.sh --build $(BUILD) --prefix $(or $(PREFIX),/usr/local) --destdir "$(DESTDIR)"

deb: all
	@scripts/mkdeb.sh $(BUILD)

# --- running -------------------------------------------------------------------

run: all
	@scripts/run.sh $(BUILD)

gpu-test: gpu
	@scripts/gpu-test.sh $(BUILD)

bench: gpu
	@scripts/bench.sh $(BUILD)

# load and soak: 256 streamed sessions against rkvd on the cpu backend for
# SOAK_MINUTES (default 5); writes $(BUILD)/soak/soak.json
.PHONY: soak
soak: all venv
	@RKV_BUILD=$(BUILD) scripts/soak.sh $(or $(SOAK_MINUTES),5)

# the system benchmarks (docs/performance.md): load ramp, spill curve (+ transformers'
# offloaded cache), HTTP overhead, budget change under load; JSON + PNG in $(BUILD)/bench-system.
# Packs the binaries first (as gpu-demo) so the pack can travel to a gpu machine
# (scripts/bench-system.sh DIR OUT there); without a gpu it runs the cpu smoke mode
.PHONY: bench-system
bench-system:
	@scripts/bench-system.sh --pack $(BUILD)/bench-system-pack $(BUILD) && \
	 scripts/bench-system.sh $(BUILD)/bench-system-pack $(BUILD)/bench-system

# fault campaign: kills and restarts under load for FAULT_MINUTES (default 5);
# writes $(BUILD)/faults/faults.json
.PHONY: faults
faults: all venv
	@RKV_BUILD=$(BUILD) scripts/faults.sh $(or $(FAULT_MINUTES),5)

# the whole system on a gpu (tests/gpu/GPU_DEMO.md): rkvd --backend cuda over HTTP, the vram
# budget, a worker SIGKILL mid-stream. Packs the binaries and their libraries first, so the
# pack can also travel to a gpu machine without Debian packages (scripts/gpu-demo.sh DIR there)
.PHONY: gpu-demo
gpu-demo:
	@scripts/gpu-demo.sh --pack $(BUILD)/gpu-demo-pack $(BUILD) && \
	 scripts/gpu-demo.sh $(BUILD)/gpu-demo-pack $(BUILD)/gpu-demo

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)/obj $(BUILD)/lib $(BUILD)/bin $(BUILD)/test $(BUILD)/fuzz-bin $(CONFIG) build/asan build/fuzz

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
