# One-command entry points (see README). `make demo` and `make test` set up .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench lint typecheck

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,postgres,dask]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/privrelease demo

# The whole suite (system tests included) on TEST_WORKERS pytest-xdist workers; the tests that share a
# session Prefect server run on one worker (tests/conftest.py). `make test TEST_WORKERS=0`: one process.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

bench: $(STAMP)
	for script in bench/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

LINTED := privrelease policies mechanisms flows reports audit bench tests tools

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

# mypy over every package, through build/typecheck/ (a link tree mirroring pyproject's package-dir,
# rebuilt on every run); errors name the real files. Settings: [tool.mypy] in pyproject.toml.
typecheck: $(STAMP)
	$(BIN)/python tools/typecheck.py
