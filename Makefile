# Two entry points that work on a fresh machine with only Python 3.11 and pip:
#   make demo   creates .venv, installs difffn with the example extras, runs the main example
#   make test   creates .venv, installs difffn with the test extras, runs the whole suite
#   make docs   builds the documentation site into site/ (mkdocs --strict: broken links fail)
#   make test-oldest  the suite on the oldest versions pyproject.toml allows (its lower bounds)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: demo test test-oldest bench lint docs clean gpu-check

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed-%: pyproject.toml | $(PY)
	$(PIP) install --quiet -e ".[$*]"
	touch $@

demo: $(VENV)/.installed-examples
	$(PY) examples/00_elu_digits.py

# -n auto: one pytest worker per core (2 on CI): most of the suite's time is XLA compiling
# and subprocesses, one core each. worksteal gives each worker a contiguous half of the
# suite (a module's fixtures run once), then rebalances when one runs dry, so a few long tests
# do not leave a core idle. --maxprocesses: each worker holds its own JAX runtime.
# --durations: the slowest tests, printed so that the 20-minute budget can be kept.
test: $(VENV)/.installed-test
	$(PY) -m pytest -q -n auto --maxprocesses=8 --dist worksteal --durations=25

# The lower bounds of pyproject.toml are versions the suite has passed on: this installs exactly
# them (tools/lower_bounds.py pins each requirement to its >= bound) in a venv of its own and runs
# the suite there. Run it before lowering a bound, and after raising one.
OLDEST := .venv-oldest
test-oldest:
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python tools/lower_bounds.py > $(OLDEST)/constraints.txt
	$(OLDEST)/bin/python -m pip install --quiet -c $(OLDEST)/constraints.txt -e ".[test]"
	$(OLDEST)/bin/python -m pytest -q -n auto --maxprocesses=8 --dist worksteal

bench: $(VENV)/.installed-bench
	$(PY) -m benchmarks

# The tests marked gpu and the benchmarks on whatever accelerator JAX sees; jax[cuda12] is
# installed for it here only (make test never needs it).
gpu-check: $(VENV)/.installed-bench $(VENV)/.installed-test
	$(PIP) install --quiet "jax[cuda12]==$$($(PY) -c 'import jax; print(jax.__version__)')"
	$(PY) -c "import jax; print('devices:', jax.devices())"
	$(PY) -m pytest -q -m gpu || [ $$? -eq 5 ]  # 5: no test marked gpu collected
	$(PY) -m benchmarks

# NO_MKDOCS_2_WARNING: mkdocs-material prints a notice about MkDocs 2.0 on every build
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check difffn tests examples benchmarks tools docs/hooks
	$(VENV)/bin/ruff format --check difffn tests examples benchmarks tools docs/hooks

clean:
	rm -rf $(VENV) $(OLDEST) .pytest_cache .hypothesis site dist elu_digits_logs elu_digits_network.png elu_digits_training_progress.png
