# minidl -- build the C core and the Python extension, run the tests.
#
#   make            the Python extension, in place (same as `make ext`)
#   make lib        build/lib/libminidl.{so,a}, build/include/minidl.h, build/lib/pkgconfig/minidl.pc
#                   (and the CUDA library and header when nvcc is found)
#   make cuda       build/lib/libminidl_cuda.so from src_cuda/ with nvcc (no GPU needed)
#   make install PREFIX=/usr/local   install the libraries, headers and minidl.pc
#   make train      installs what is missing, builds, trains cifar10_quick on CIFAR-10
#                   (DATA=dir for the data root, ARGS="..." for more `minidl train` options)
#   make test       everything (with `make cuda` when nvcc is found), then the C API tests and pytest
#   make sanitize   the C test and a pytest subset under AddressSanitizer + UBSan
#   make bench      the benchmarks under bench/
PYTHON  ?= python3
CC      ?= gcc
PREFIX  ?= /usr/local
BUILD   := build
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)

# setup.py's C_FLAGS, OPT, AVX2_FLAGS, AVX512_FLAGS, SAN_FLAGS: both compile src_c/ into
# $(BUILD)/obj/ (setup.py's sanitizer build into $(BUILD)/asan-obj/), so the lists must match
CFLAGS_COMMON := -std=c11 -fPIC -fopenmp -fvisibility=hidden -Wall -Wextra -Wno-unused-parameter -Iinclude
OPT           := -O3
AVX2_FLAGS    := -mavx2 -mfma -fno-tree-loop-distribute-patterns -Wa,-mbranches-within-32B-boundaries
AVX512_FLAGS  := -mavx512f $(AVX2_FLAGS)
SAN_FLAGS     := -O1 -g -fno-var-tracking-assignments -fno-omit-frame-pointer \
                 -fsanitize=address,undefined -fno-sanitize-recover=all

SRCS := $(wildcard src_c/*.c)
HDRS := $(wildcard src_c/*.h) include/minidl.h
OBJS := $(patsubst src_c/%.c,$(BUILD)/obj/%.o,$(SRCS))

# nvcc on PATH or in $CUDA_HOME/bin (NVCC=... overrides; none with MINIDL_CUDA=0, as
# for setup.py); said once, at the top level
ifeq ($(origin NVCC),undefined)
NVCC := $(if $(filter 0,$(MINIDL_CUDA)),,$(or $(shell command -v nvcc 2>/dev/null),$(if $(CUDA_HOME),$(wildcard $(CUDA_HOME)/bin/nvcc))))
endif
ifeq ($(MAKELEVEL),0)
$(info minidl: $(if $(NVCC),nvcc found at $(NVCC) -- the CUDA kernels are built too,no nvcc on PATH or in CUDA_HOME (or MINIDL_CUDA=0) -- CPU only))
endif
CUDA_ARCH := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
# setup.py's NVCC_FLAGS: both compile into $(BUILD)/cuda/, so the two must match
NVCCFLAGS := -O3 -std=c++17 --compiler-options -fPIC,-fvisibility=hidden -Werror all-warnings \
             -Iinclude $(CUDA_ARCH)
CU_SRCS := $(wildcard src_cuda/*.cu)
# src_c/checks.h, optim_hp.h: what both sides share (included as ../src_c/X.h)
CU_HDRS := $(wildcard src_cuda/*.cuh) src_c/checks.h src_c/optim_hp.h include/minidl.h include/minidl_cuda.h
CU_OBJS := $(patsubst src_cuda/%.cu,$(BUILD)/cuda/%.o,$(CU_SRCS))

.PHONY: all deps ext lib cuda install train test test-c test-py sanitize bench clean

# objects are compiled a file per CPU at a time unless make was given its own -j
PAR = $(if $(findstring j,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 1))
compile = $(MAKE) --no-print-directory $(PAR) $(1)
all: ext

# the build and test requirements, installed only when one is missing
deps:
	@$(PYTHON) -c "import setuptools, Cython, numpy, pytest, tqdm" 2>/dev/null || \
	    $(PYTHON) -m pip install -q -r requirements-dev.txt

# the CUDA objects first, in parallel here; setup.py then finds them (and the core's
# objects `make lib` made) up to date
ext: deps $(if $(NVCC),cuda)
	$(PYTHON) setup.py -q build_ext --inplace

train: ext
	$(PYTHON) -m minidl train --model cifar10_quick $(if $(DATA),--data $(DATA)) $(ARGS)

# ---- the C library -------------------------------------------------------------------
flags_for = $(if $(filter %_avx2.c,$(1)),$(AVX2_FLAGS))$(if $(filter %_avx512.c,$(1)),$(AVX512_FLAGS))

$(BUILD)/obj/%.o: src_c/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_COMMON) $(OPT) $(call flags_for,$<) -c $< -o $@

$(BUILD)/lib/libminidl.so: $(SRCS) $(HDRS)
	@$(call compile,$(OBJS))
	@mkdir -p $(dir $@)
	$(CC) -shared -fopenmp -Wl,-soname,libminidl.so -o $@ $(OBJS) -lm

$(BUILD)/lib/libminidl.a: $(BUILD)/lib/libminidl.so
	rm -f $@ && ar rcs $@ $(OBJS)

$(BUILD)/include/minidl.h: include/minidl.h
	@mkdir -p $(dir $@)
	cp $< $@

$(BUILD)/lib/pkgconfig/minidl.pc: minidl.pc.in pyproject.toml
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(abspath $(BUILD))|' -e 's|@VERSION@|$(VERSION)|' $< > $@

lib: $(BUILD)/lib/libminidl.so $(BUILD)/lib/libminidl.a $(BUILD)/include/minidl.h \
     $(BUILD)/lib/pkgconfig/minidl.pc $(if $(NVCC),cuda)

# ---- the CUDA library: one nvcc per file, in parallel, the CUDA runtime linked in
# statically and kept private, so users need only the driver; setup.py compiles into
# the same objects with the same flags -----------------------------------------------
$(BUILD)/cuda/%.o: src_cuda/%.cu $(CU_HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/lib/libminidl_cuda.so: $(CU_SRCS) $(CU_HDRS)
	@$(call compile,$(CU_OBJS))
	@mkdir -p $(dir $@)
	$(NVCC) -shared -cudart static -Xlinker --exclude-libs,ALL,-soname,libminidl_cuda.so -o $@ $(CU_OBJS)

$(BUILD)/include/minidl_cuda.h: include/minidl_cuda.h
	@mkdir -p $(dir $@)
	cp $< $@

ifneq ($(NVCC),)
cuda: $(BUILD)/lib/libminidl_cuda.so $(BUILD)/include/minidl_cuda.h
else
cuda:
	@echo "make cuda: nvcc is neither on PATH nor in CUDA_HOME (or set NVCC=...)"; exit 1
endif

install: lib
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 644 $(BUILD)/include/minidl.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 $(BUILD)/lib/libminidl.so $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(BUILD)/lib/libminidl.a $(DESTDIR)$(PREFIX)/lib/
	if [ -f $(BUILD)/lib/libminidl_cuda.so ]; then \
	    install -m 644 $(BUILD)/include/minidl_cuda.h $(DESTDIR)$(PREFIX)/include/ && \
	    install -m 755 $(BUILD)/lib/libminidl_cuda.so $(DESTDIR)$(PREFIX)/lib/; fi
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' minidl.pc.in \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/minidl.pc

# ---- tests ---------------------------------------------------------------------------
STAGE := $(abspath $(BUILD)/stage)

# The C API test: built only from the installed header and library, found by pkg-config.
test-c: lib
	$(MAKE) --no-print-directory install PREFIX=$(STAGE)
	$(CC) -std=c11 -Wall -Wextra tests/c/test_capi.c -o $(BUILD)/test_capi \
	    $$(PKG_CONFIG_PATH=$(STAGE)/lib/pkgconfig pkg-config --cflags --libs minidl) -lm
	LD_LIBRARY_PATH=$(STAGE)/lib $(BUILD)/test_capi
	$(CC) -std=c11 -Wall -Wextra tests/c/test_capi.c -o $(BUILD)/test_capi_static \
	    $$(PKG_CONFIG_PATH=$(STAGE)/lib/pkgconfig pkg-config --static --cflags minidl) \
	    $(STAGE)/lib/libminidl.a $$(PKG_CONFIG_PATH=$(STAGE)/lib/pkgconfig pkg-config --static --libs-only-other minidl) -lm
	$(BUILD)/test_capi_static
ifneq ($(NVCC),)
	$(CC) -std=c11 -Wall -Wextra tests/c/test_cuda_capi.c -o $(BUILD)/test_cuda_capi \
	    -I$(STAGE)/include -L$(STAGE)/lib -lminidl_cuda -Wl,-rpath,$(STAGE)/lib
	$(BUILD)/test_cuda_capi
endif

# one pytest process per CPU where pytest-xdist is installed (requirements-dev.txt); their
# OpenMP threads then outnumber the CPUs, so a waiting one sleeps instead of spinning
PYTEST = $(if $(shell $(PYTHON) -c 'import xdist' 2>/dev/null && echo y),OMP_WAIT_POLICY=passive \
         $(PYTHON) -m pytest -n $(shell nproc 2>/dev/null || echo 1),$(PYTHON) -m pytest)

test-py: ext
	$(PYTEST) -q tests

test: $(if $(NVCC),cuda) test-c test-py

# ---- sanitizers ----------------------------------------------------------------------
# setup.py compiles the core once with the sanitizers (MINIDL_SANITIZE=1); the C test
# links its static library, the pytest suite its extension
ASAN_RT := $(shell $(CC) -print-file-name=libasan.so)
UBSAN_RT := $(shell $(CC) -print-file-name=libubsan.so)
SAN_PY  := $(abspath $(BUILD)/asan-py)

sanitize:
	MINIDL_SANITIZE=1 $(PYTHON) setup.py -q build --build-base $(BUILD)/asan-setup --build-lib $(SAN_PY)
	$(CC) -std=c11 $(SAN_FLAGS) -Iinclude tests/c/test_capi.c $(SAN_PY)/minidl/lib/libminidl.a \
	    -fopenmp -lm -o $(BUILD)/test_capi_asan
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 $(BUILD)/test_capi_asan
	cd tests && LD_PRELOAD="$(ASAN_RT) $(UBSAN_RT)" ASAN_OPTIONS=detect_leaks=0 \
	    UBSAN_OPTIONS=print_stacktrace=1 PYTHONPATH=$(SAN_PY) MINIDL_EXPECT_PATH=$(SAN_PY) \
	    $(PYTEST) -q -x -p no:cacheprovider -m "not external and not slow" .

bench: ext
	$(PYTHON) bench/bench_gemm.py
	$(PYTHON) bench/bench_membound.py
	$(PYTHON) bench/bench_conv.py

clean:
	rm -rf $(BUILD) minidl/_C.c minidl/_cuda.c minidl/*.so minidl/lib minidl/include
