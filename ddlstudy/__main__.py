"""``python -m ddlstudy``: the command line. Python puts the working directory first on its
path for ``-m``, so a ``ddlstudy/`` folder there (the root of a clone, beside an editable
install) is imported as the package, and this file, found by the install, runs under it:
that is said in one line (exit 2), not as an ImportError."""

import sys
from pathlib import Path

import ddlstudy


def _hidden_by() -> str | None:
    """The folder that was imported as ``ddlstudy`` instead of this file's package."""
    here = Path(__file__).resolve().parent
    found = [Path(p).resolve() for p in getattr(ddlstudy, "__path__", ())]
    return None if here in found else ", ".join(map(str, found)) or "?"


if (_other := _hidden_by()) is not None:
    print(f"ddlstudy: the folder {_other} hides the installed ddlstudy package (`python -m` "
          "puts the working directory first on Python's path); run the `ddlstudy` command, "
          "`python -P -m ddlstudy`, or work from another folder", file=sys.stderr)
    raise SystemExit(2)

from ddlstudy.cli import main  # noqa: E402 (after the check: it imports the package's parts)

raise SystemExit(main())
