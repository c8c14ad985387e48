# make demo: .venv, install, synthetic data, a small study (usecases/demo.toml), its
#            speedup tables and figures (runs/demo/report/).
# make test: .venv if missing, ruff, the import contracts (lint-imports), the whole test suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := runs/demo

.PHONY: install demo test lint clean-demo notebook

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/ddlstudy dataset make --usecase tiny
	$(BIN)/ddlstudy study usecases/demo.toml --resume

notebook: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,notebook]'
	$(BIN)/jupyter lab analysis/study.ipynb

lint: $(STAMP)
	$(BIN)/ruff check ddlstudy tests
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest

clean-demo:
	rm -rf $(DEMO)
