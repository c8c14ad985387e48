"""Hosts of a given size: ``hosts up --memory`` limits each emulated host's memory (a
cgroup), and a run whose process the kernel kills for it says so, which rank, which host,
the limit and the peak, while a study goes on with its next cell."""

from __future__ import annotations

import json
import re

import pytest

from ddlstudy import hosts
from ddlstudy.cli import main
from ddlstudy.hosts import cgroups, spec, state
from ddlstudy.records.runfolder import MANIFEST

WHY_NOT = hosts.can_emulate()
needs_hosts = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
LIMIT = 700 << 20
"""Room for a node of one tiny process (about 0.49 GiB of memory charged to its host),
not for a node of two (about 0.95 GiB): measured on this machine's cgroup v1."""


@pytest.mark.slow
@needs_hosts
def test_a_host_too_small_fails_the_run_and_names_rank_host_limit_and_peak(tmp_path,
                                                                           datasets_dir):
    """A node of two processes on hosts with room for one: the kernel kills one, and the
    run is recorded failed with who, where, the limit and the peak (a study records the
    cell failed with that reason and goes on, as with any failed cell: test_study)."""
    made = hosts.up(2, prefix="dmem", subnet="10.82.0", memory=LIMIT)
    groups = [cgroups.group(n, "memory") for n in made.names]
    runs = tmp_path / "runs"
    try:
        for group in groups:
            limit = group / "memory.limit_in_bytes"
            assert int((limit if limit.exists() else group / "memory.max").read_text()) \
                == LIMIT
        assert f"{groups[0]}/cgroup.procs" in made.launcher.read_text()  # ranks join it
        code = main(["run", "--usecase", "tiny", "--backend", "mpi", "--nodes", "2",
                     "--hosts", "emulated:dmem", "--strategy", "cpu-processes", "--workers",
                     "2", "--epochs", "1", "--max-steps", "3", "--max-val-steps", "1",
                     "--no-snapshot", "--sample-hz", "0", "--datasets-dir",
                     str(datasets_dir), "--runs-dir", str(runs)])
    finally:
        hosts.down("dmem")
    assert code != 0
    assert not any(g.exists() for g in groups)  # down removes the memory cgroups
    (manifest,) = runs.glob(f"*/{MANIFEST}")
    failed = json.loads(manifest.read_text())
    assert failed["status"] == "failed"
    error = failed["error"]
    # the kernel kills in whichever host first runs out; its rank is named with it
    found = re.search("a process of MPI rank ([01]) on host dmem-h([12]) was killed by the "
                      "kernel for memory", error)
    assert found and int(found[2]) == int(found[1]) + 1, error  # rank 0 on host 1
    assert "the host has 0.68 GiB, and its processes held 0.68 GiB at their peak" in error
    assert "hosts up --memory" in error and "sharded" in error
    charged = failed["backend"]["memory"]["hosts"]  # each host's own account, as recorded
    assert set(charged) == {"dmem-h1", "dmem-h2"}
    assert charged[f"dmem-h{found[2]}"]["oom_kills"] >= 1
    # the kernel may charge a few pages past the limit where a charge cannot fail (cgroup
    # v1's forced charges: a page table, the killed process's way out); one page over was
    # seen (734,007,296 against 734,003,200), so the peak is held to the limit and 1 MiB
    assert all(h["limit_bytes"] == LIMIT and 0 < h["peak_charged_bytes"] <= LIMIT + (1 << 20)
               for h in charged.values()), charged


def test_a_record_from_before_memory_reads_as_unlimited(tmp_path, monkeypatch):
    monkeypatch.setattr(spec, "STATE_DIR", tmp_path)
    made = state.State(spec.Hosts("dold", 2, "10.83.0", cpus=[1.0, 0.5]))
    state.write(made)
    record = json.loads(made.path.read_text())
    del record["hosts"]["memory"]  # as hosts up wrote it before --memory
    made.path.write_text(json.dumps(record))
    assert state.read("dold").hosts == spec.Hosts("dold", 2, "10.83.0", cpus=[1.0, 0.5])


@pytest.mark.parametrize("size, message", [
    ("1MiB", "--memory: 1048576 bytes a host; give from 64 MiB"),
    ("lots", "--memory: 'lots'; give a size"),
])
def test_a_host_size_that_cannot_be_is_refused(tmp_path, capsys, monkeypatch, size, message):
    monkeypatch.setattr(spec, "STATE_DIR", tmp_path)
    assert main(["hosts", "up", "--prefix", "dbad", "--memory", size]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@needs_hosts
def test_a_subnet_another_set_uses_is_refused(capsys):
    """Two bridges with one gateway address route neither (a Slurm test's daemons could
    not reach their controller so): the second set is refused, nothing of it made."""
    hosts.up(1, prefix="dsub", subnet="10.84.0")
    try:
        assert main(["hosts", "up", "--count", "1", "--prefix", "dsub2", "--subnet",
                     "10.84.0"]) == 2
        assert "--subnet: 10.84.0 is in use here (by the emulated hosts 'dsub'); give " \
            "another, e.g. --subnet 10." in capsys.readouterr().err
        assert state.read("dsub2") is None
    finally:
        hosts.down("dsub")
