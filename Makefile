# Two user commands: `make demo` and `make test`. Each sets up a bare machine
# (virtualenv, pinned torch and torch-mlir, test tools, the C++ extension)
# and then runs; re-running rebuilds only what changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMPS := .stamps
CXX_SOURCES := $(wildcard lazy_backend/*.cpp lazy_backend/*.h runtime/*.cpp runtime/*.h)

.PHONY: demo test setup clean
demo: $(STAMPS)/install
	$(BIN)/python examples/train_gpt.py

test: $(STAMPS)/install
	$(BIN)/python -m pytest -q tests

setup: $(STAMPS)/install

$(STAMPS)/deps: requirements.txt
	@mkdir -p $(STAMPS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -r requirements.txt
	@touch $@

# --no-build-isolation: build against the pinned torch installed above.
$(STAMPS)/install: $(STAMPS)/deps pyproject.toml CMakeLists.txt $(CXX_SOURCES)
	$(BIN)/python -m pip install -q --no-build-isolation --no-deps -e .
	@touch $@

clean:
	rm -rf build $(STAMPS)
