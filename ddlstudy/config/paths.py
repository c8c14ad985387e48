"""Where ddlstudy finds its use cases and puts data sets and runs by default.

Use cases and study plans ship inside the package (``ddlstudy.usecases``, read through
``importlib.resources``); in a source checkout the top-level ``usecases/`` folder is that
package (``setup.py`` maps it), read in place so that an edit there takes effect at once.

Data sets and runs go under ``$DDLSTUDY_HOME`` if set, else the working directory:
``./datasets/`` and ``./runs/``, never inside site-packages.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The source checkout ddlstudy runs from (for its git commit); in an installed wheel, the
site-packages folder, which has no git."""


CACHE_ENV = "DDLSTUDY_CACHE"
"""Where ddlstudy keeps what it can compute again (decoded images, checked images and
models), if set; else $XDG_CACHE_HOME/ddlstudy or ~/.cache/ddlstudy."""


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ddlstudy"


def _usecases_dir() -> Path:
    checkout = REPO_ROOT / "usecases"
    if (REPO_ROOT / "pyproject.toml").is_file() and checkout.is_dir():
        return checkout
    return Path(str(resources.files("ddlstudy") / "usecases"))


def _home() -> tuple[Path, str]:
    """$DDLSTUDY_HOME (or the working directory), and what is wrong with it ('' if
    nothing): a ``~user`` of no user cannot be expanded, which the commands that write
    refuse (``home_problem``) while --help still works."""
    given = os.environ.get("DDLSTUDY_HOME") or os.getcwd()
    try:
        return Path(given).expanduser().absolute(), ""
    except RuntimeError:
        return Path(given).absolute(), (f"DDLSTUDY_HOME={given!r} names no user's home; set "
                                        "it to a folder, or unset it")


USECASES_DIR = _usecases_dir()
HOME, HOME_PROBLEM = _home()
DEFAULT_DATASETS_DIR = HOME / "datasets"
DEFAULT_RUNS_DIR = HOME / "runs"

ADVICE_CHECKS_ENV = "DDLSTUDY_ADVICE_CHECKS"
"""The file where every advice check on this host is remembered (default
``<runs>/advise/checks.jsonl``): ``advise`` says how the last one did."""
