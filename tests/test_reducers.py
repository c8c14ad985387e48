"""The reducers under a real `mpiexec` (the mpich wheel's), with odd and even rank counts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddlstudy.backends.mpi.launch import find_mpiexec
from ddlstudy.errors import ConfigError
from ddlstudy.reducers import REDUCERS, get_reducer

SCRIPT = Path(__file__).parent / "mpi" / "check_reducers.py"


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_reducers_under_mpiexec(ranks):
    mpiexec = find_mpiexec()
    assert mpiexec, "mpiexec is installed with the mpich wheel"
    out = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, str(SCRIPT)],
                         capture_output=True, text=True, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["failures"] == [], result["failures"]
    assert result["ranks"] == ranks
    assert result["checked"] == 6 * (4 + ranks + 1) + 1
    assert out.returncode == 0, out.stderr[-2000:]


def test_unknown_reducer_lists_the_names():
    with pytest.raises(ConfigError, match="choose one of: allreduce, parameter-server"):
        get_reducer("gossip")
    assert set(REDUCERS) == {"allreduce", "parameter-server", "ring-reduce", "ring-allreduce",
                             "step-wise"}
