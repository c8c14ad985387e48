"""A run's id, the name of its folder: made (``new_run_id``), checked (``checked_run_id``:
a plain folder name, not taken) and claimed for the ranks a launcher starts (``claim``),
so that of two runs given one id the second is refused before it starts."""

from __future__ import annotations

import datetime as dt
import os
import re
import secrets
from pathlib import Path

from ddlstudy.errors import UsageError
from ddlstudy.machine.sampler import TREE_ROOT_ENV

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
RUN_ID_ENV = "DDLSTUDY_RUN_ID"
"""The run id a launcher (ddlstudy's mpiexec, a study) gives the run folder it starts."""
CHILD_ENV = "DDLSTUDY_MPI_CHILD"
"""Set in the ranks of ddlstudy's own mpiexec (they join its world instead of launching)."""


def new_run_id(usecase: str, strategy: str, backend: str = "local") -> str:
    """A new run's id: when, the use case, the backend (but local) and the strategy."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    what = strategy if backend == "local" else f"{backend}-{strategy}"
    return f"{stamp}-{usecase}-{what}-{secrets.token_hex(2)}"


def checked_run_id(run_id: str, runs_dir: Path | None = None) -> str:
    """``run_id`` if it is a plain folder name (a DDLSTUDY_RUN_ID could hold a path) and,
    given ``runs_dir``, names no run there yet: checked before anything is prepared or
    written."""
    if not _RUN_ID.fullmatch(run_id):
        given = f" (check {RUN_ID_ENV})" if os.environ.get(RUN_ID_ENV) == run_id else ""
        raise UsageError(f"run id {run_id!r} is not a plain folder name; the run folder "
                         f"must stay inside the runs folder{given}")
    where = Path(runs_dir) / run_id if runs_dir is not None else None
    if where is not None and (where.exists() or where.is_symlink()) and \
            not claimed_for_this(where):
        refuse_taken(where)
    return run_id


def refuse_taken(where: Path) -> None:
    raise UsageError(f"{where} already exists; a new run needs a run id of its own "
                     f"(unset {RUN_ID_ENV}, or --resume that run)")


CLAIM = ".claimed-by-"
"""The mark, with the launcher's PID, in the run folder a launcher claims for its ranks."""


def claim(runs_dir: Path, run_id: str) -> list[Path]:
    """Claim folder ``run_id`` for the ranks this process launches (``--backend mpi``):
    made, empty but for this process's mark, which its rank 0's ``RunFolder.create`` takes
    up; one there already is refused here, before any rank starts (of two launches given
    one id, the second). Returns what it made, to ``release`` when the launch ends."""
    path = Path(runs_dir) / checked_run_id(run_id)
    made = [p for p in (path.parent, path) if not p.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
        (path / f"{CLAIM}{os.getpid()}").touch()
    except FileExistsError:
        refuse_taken(path)
    except OSError as exc:  # a full disk, a folder made read-only since it was checked
        release(made)
        raise UsageError(f"the run folder {path} cannot be made ({exc.strerror}); free some "
                         f"space or give another --runs-dir, then run it again") from None
    return made


def release(made: list[Path]) -> None:
    """This process's claim (what ``claim`` made), where no rank took it up (the launch
    failed before the run folder was written): its mark, and the folders left empty."""
    (made[-1] / f"{CLAIM}{os.getpid()}").unlink(missing_ok=True)
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:  # a rank wrote in it: the run folder, and the runs folder above
            return


def claimed_for_this(path: Path) -> bool:
    """Whether ``path`` is claimed by the launcher that started this process."""
    launcher = os.environ.get(TREE_ROOT_ENV)
    return launcher is not None and (path / f"{CLAIM}{launcher}").is_file()
