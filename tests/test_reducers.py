"""The reducers under a real `mpiexec` (the mpich wheel's), with odd and even rank counts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddlstudy.backends.mpi.launch import find_mpiexec
from ddlstudy.errors import ConfigError
from ddlstudy.reducers import REDUCERS, choose, get_reducer

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


def test_auto_takes_the_ring_for_large_gradients_by_rank_count():
    """MPICH's Allreduce below RING_FROM_MIB, the ring from there: 16 MiB for 2 or 4 ranks,
    8 for 3 (MPICH's extra step for a rank count that is not a power of two)."""
    mib = 2**20
    assert choose(14 * mib, 2) == "allreduce"  # tiny's 13.6 MiB between 2 nodes
    assert choose(16 * mib, 2) == "ring-allreduce"
    assert choose(228_000_000, 2) == "ring-allreduce"  # AlexNet
    assert choose(8 * mib - 1, 3) == "allreduce" and choose(8 * mib, 3) == "ring-allreduce"
    assert choose(14 * mib, 4) == "allreduce" and choose(16 * mib, 4) == "ring-allreduce"
    assert choose(10**9, 1) == "allreduce"  # nothing to exchange


def test_the_manifest_names_the_reducer_auto_chose(quick_config):
    from ddlstudy.backends import get_backend

    mpi = get_backend("mpi")
    assert mpi.describe(quick_config(backend="mpi", nodes=2))["reduce"] == "allreduce"
    three = mpi.describe(quick_config(backend="mpi", nodes=3))
    assert three["reduce"] == "ring-allreduce" and three["reduce_asked"] == "auto"
    named = mpi.describe(quick_config(backend="mpi", nodes=3, reduce="ring-reduce"))
    assert named["reduce"] == "ring-reduce" and "reduce_asked" not in named


def test_unknown_reducer_lists_the_names():
    with pytest.raises(ConfigError, match="choose one of: allreduce, parameter-server"):
        get_reducer("gossip")
    assert set(REDUCERS) == {"allreduce", "parameter-server", "ring-reduce", "ring-allreduce",
                             "step-wise"}
