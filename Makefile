# Two user commands: `make demo` and `make test`. Each sets up a bare machine
# (virtualenv, pinned torch and torch-mlir, test tools, the C++ extension)
# and then runs; re-running rebuilds only what changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMPS := .stamps
CXX_SOURCES := $(wildcard lazy_backend/*/*.cpp lazy_backend/*/*.h runtime/*.cpp runtime/*.h)
# torch 2.13.0's CUDA build (with its Triton) on a machine with an NVIDIA GPU,
# else whichever build pip's index serves (a CPU one here). Override with
# `make test TORCH_BUILD=cpu`. The CUDA build is the one without a local
# version tag: `===` (exact string) excludes a find-links 2.13.0+cpu wheel.
ifndef TORCH_BUILD
TORCH_BUILD := $(shell nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)
endif
TORCH_PIN_cuda := "torch===2.13.0"
TORCH_CHECK_cuda := $(BIN)/python -c "import torch, triton; assert torch.cuda.is_available(), \
	f'torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU; a CPU build needs an index serving the CUDA one'"
DEPS := $(STAMPS)/deps-$(TORCH_BUILD)

.PHONY: demo test setup clean asan asan-soak asan-test
demo: $(STAMPS)/install
	$(BIN)/python examples/train_gpt.py

# Two pytest-xdist workers, whole files each (a file's tests share their
# compiled graphs and fixtures): the suite is mostly single-threaded compiles.
PYTEST_WORKERS ?= 2
test: $(STAMPS)/install
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

setup: $(STAMPS)/install

$(DEPS): requirements.txt
	@mkdir -p $(STAMPS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -r requirements.txt $(TORCH_PIN_$(TORCH_BUILD))
	$(TORCH_CHECK_$(TORCH_BUILD))
	@rm -f $(STAMPS)/deps-* && touch $@  # one build's stamp at a time: switching back reinstalls

# --no-build-isolation: build against the pinned torch installed above.
# Then refuse an extension that holds its own copy of libstdc++ (a compiler
# that links it statically): it would segfault in torch's iostreams at the
# first traced optimizer step (the test says how to rebuild).
$(STAMPS)/install: $(DEPS) pyproject.toml CMakeLists.txt $(CXX_SOURCES)
	$(BIN)/python -m pip install -q --no-build-isolation --no-deps -e .
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_extension_build.py
	@rm -f $(STAMPS)/asan && touch $@

# AddressSanitizer: the extension built instrumented into build/asan and
# put in place of the installed one ($(STAMPS)/asan says it is there; the next
# `make setup`, `test` or `demo` reinstalls the normal build), libasan and
# libstdc++ preloaded into Python so torch's and gloo's frees are checked too
# (double and invalid frees). The copy is renamed into place: a process that
# has the installed .so loaded keeps its own (cp would rewrite it under it).
ASAN_RUN := LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" \
	ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0:halt_on_error=1
RUNS ?= 50
asan: $(STAMPS)/asan
$(STAMPS)/asan: $(DEPS) pyproject.toml CMakeLists.txt $(CXX_SOURCES)
	$(MAKE) --no-print-directory $(STAMPS)/install
	cmake -S . -B build/asan -DPython_EXECUTABLE=$(abspath $(BIN)/python) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DCMAKE_CXX_FLAGS="-fsanitize=address -fno-omit-frame-pointer" -DCMAKE_MODULE_LINKER_FLAGS=-fsanitize=address
	cmake --build build/asan -j2
	so=$$(cd build/asan && echo _C*.so) && dest="$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')/lazy_mlir/native" \
		&& cp build/asan/$$so "$$dest/.$$so.asan" && mv -f "$$dest/.$$so.asan" "$$dest/$$so"
	rm -f $(STAMPS)/install
	@touch $@

asan-soak: asan
	$(ASAN_RUN) $(BIN)/python tools/zero_soak.py --runs $(RUNS)

asan-test: asan
	$(ASAN_RUN) $(BIN)/python -m pytest -q -p no:logging tests

clean:
	rm -rf build $(STAMPS)
