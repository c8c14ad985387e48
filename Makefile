# make demo: .venv, install, synthetic data, a small study, its speedup table.
# make test: .venv if missing, ruff, the whole test suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := runs/demo

.PHONY: install demo test lint clean-demo

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/ddlstudy dataset make --usecase tiny
	$(BIN)/ddlstudy run --usecase tiny --strategy sequential --runs-dir $(DEMO)
	$(BIN)/ddlstudy run --usecase tiny --strategy cpu-intraop --runs-dir $(DEMO)
	$(BIN)/ddlstudy run --usecase tiny --strategy cpu-threads --runs-dir $(DEMO)
	$(BIN)/ddlstudy run --usecase tiny --strategy cpu-processes --runs-dir $(DEMO)
	$(BIN)/ddlstudy report $(DEMO)

lint: $(STAMP)
	$(BIN)/ruff check ddlstudy tests

test: lint
	$(BIN)/pytest

clean-demo:
	rm -rf $(DEMO)
