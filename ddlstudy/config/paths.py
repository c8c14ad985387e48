"""Where ddlstudy finds its use cases and puts data sets and runs by default."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
USECASES_DIR = REPO_ROOT / "usecases"
DEFAULT_DATASETS_DIR = REPO_ROOT / "datasets"
DEFAULT_RUNS_DIR = REPO_ROOT / "runs"
