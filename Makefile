# Two entry points that work on a fresh machine with only Python 3.11 and pip:
#   make demo   creates .venv, installs difffn with the example extras, runs the main example
#   make test   creates .venv, installs difffn with the test extras, runs the whole suite
#   make docs   builds the documentation site into site/ (mkdocs --strict: broken links fail)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: demo test bench lint docs clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed-%: pyproject.toml | $(PY)
	$(PIP) install --quiet -e ".[$*]"
	touch $@

demo: $(VENV)/.installed-examples
	$(PY) examples/00_elu_digits.py

test: $(VENV)/.installed-test
	$(PY) -m pytest -q

bench: $(VENV)/.installed-bench
	$(PY) -m benchmarks

# NO_MKDOCS_2_WARNING: mkdocs-material prints a notice about MkDocs 2.0 on every build
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check difffn tests examples benchmarks
	$(VENV)/bin/ruff format --check difffn tests examples benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis site
