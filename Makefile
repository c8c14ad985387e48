# make demo: .venv, install, synthetic data, a small study (usecases/demo.toml), its
#            speedup tables and figures (runs/demo/report/), and last the path of its
#            page, runs/demo/report/index.html.
# make test: .venv if missing, ruff, the import contracts (lint-imports), the whole test suite
#            (tests/test_docs.py builds the documentation site strictly): two files at a
#            time, then the serial tests alone.
# make paper: the paper's Tables 1-3 on both of its use cases, a few steps a cell
#            (usecases/paper-quick.toml, under 45 minutes on 2 cores), and the findings.
# make docs: the reference pages regenerated from the code (docs/reference/), then the
#            documentation site built with mkdocs --strict into site/.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO   := runs/demo
RUNS   ?= $(DEMO)
TORCH_NOTE := 2.14.1 is a CUDA build of about 5.5 GB even on a CPU-only machine: a few minutes
NEED_GB    := 7

.PHONY: install demo paper test lint docs clean-demo notebook notebook-run gpu-check

$(STAMP): pyproject.toml setup.py
	@echo "installing ddlstudy and its dependencies into $(VENV): torch $(TORCH_NOTE)"
	@free=$$(df -Pk . | awk 'NR == 2 {print int($$4 / 1048576)}'); \
	if [ ! -x $(BIN)/python ] && [ "$$free" -lt $(NEED_GB) ]; then \
	    echo "make: $(VENV) needs about $(NEED_GB) GB of disk and $$free GB are free here:" \
	         "free some (older clones' .venv folders?), then run make again" >&2; exit 2; fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)
	@echo "installed: $(BIN)/ddlstudy --help"

install: $(STAMP)

# ddlstudy's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (CI, many
# sandboxes) each process would compile every module of ddlstudy again (0.6 s of CPU a
# process, three processes a 2-process run)
BYTECODE := $(BIN)/python -m compileall -q ddlstudy tests

demo: $(STAMP)
	$(BYTECODE)
	$(BIN)/ddlstudy dataset make --usecase tiny
	$(BIN)/ddlstudy study usecases/demo.toml --resume
	@echo "the study as one page (offline, open it in a browser): $(abspath $(DEMO))/report/index.html"

paper: $(STAMP)
	$(BIN)/ddlstudy study paper-quick --resume

notebook: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,notebook]'
	$(BIN)/jupyter lab analysis/study.ipynb

# The analysis notebook, executed headless on RUNS (default: the demo's runs) into
# RUNS/report/study.ipynb and study.html. INCLUDE_NOISY=1 counts the runs marked noisy
# (other processes used their host), as `ddlstudy report --include-noisy` does.
notebook-run: $(STAMP)
	DDLSTUDY_RUNS=$(abspath $(RUNS)) DDLSTUDY_INCLUDE_NOISY=$(INCLUDE_NOISY) \
	    $(BIN)/jupyter nbconvert --to notebook --execute \
	    analysis/study.ipynb --output-dir $(RUNS)/report
	$(BIN)/jupyter nbconvert --to html $(RUNS)/report/study.ipynb

# On a machine with CUDA GPUs: the gpu-marked tests, then a short gpu-data, pipeline and
# hybrid run on the GPUs (each says what it ran on).
gpu-check: $(STAMP)
	$(BIN)/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
	    print(torch.cuda.device_count(), 'GPU(s):', torch.cuda.get_device_name(0))"
	$(BIN)/pytest -m gpu -v
	$(BIN)/ddlstudy dataset make --usecase tiny
	$(BIN)/ddlstudy run --usecase tiny --strategy gpu-data --epochs 2 --runs-dir runs/gpu-check
	$(BIN)/ddlstudy run --usecase tiny --strategy pipeline --stages 2 --epochs 2 \
	    --runs-dir runs/gpu-check
	$(BIN)/ddlstudy run --usecase tiny --strategy hybrid --replicas 1 --stages 2 --epochs 2 \
	    --runs-dir runs/gpu-check
	# sharded (FSDP2), zero and tensor over NCCL: one process a GPU, 2 where there are 2
	set -e; k=$$($(BIN)/python -c "import torch; print(min(2, torch.cuda.device_count()))"); \
	for s in sharded zero tensor; do \
	    $(BIN)/ddlstudy run --usecase tiny --strategy $$s --workers $$k --epochs 2 \
	        --runs-dir runs/gpu-check; done
	$(BIN)/ddlstudy report runs/gpu-check

lint: $(STAMP)
	$(BIN)/ruff check ddlstudy tests
	$(BIN)/lint-imports

# The suite in two parts: first every test not marked serial, TEST_WORKERS files at a time
# (pytest-xdist; a file's tests on one worker, which shares its fixtures: about a third of a
# 2-core host waits on daemons, JVMs and child processes when they run one at a time); then
# the serial ones alone (they compare speeds, load the host or shape its network). Both
# parts always run; make fails if either did. `pytest` alone runs everything in order.
TEST_WORKERS ?= 2

test: lint
	$(BYTECODE)
	@status=0; \
	$(BIN)/pytest -m "not serial" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder || status=$$?; \
	$(BIN)/pytest -m serial || status=$$?; \
	exit $$status

docs: $(STAMP)
	$(BIN)/python -m ddlstudy.cli.reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean-demo:
	rm -rf $(DEMO)
