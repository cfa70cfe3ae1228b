# Everything installs into .venv (Python 3.11+); `make test` is the README's test command.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install test train-test bench clean

install: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[test]"
	touch $@

test: install
	$(BIN)/python -m pytest -q

train-test: install
	$(BIN)/python train.py --config configs/test.py --workdir runs/test

bench: install
	$(BIN)/python bench/bench_model.py

clean:
	rm -rf $(VENV) *.egg-info
