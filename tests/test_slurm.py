"""A real Slurm on emulated hosts: munged, slurmctld and a slurmd per host started by
`ddlstudy hosts slurm`, an MPI run across two of them under `srun --mpi=pmi2`, and
`hosts down` leaving none of it behind. Skipped, saying why, without root or without
Slurm's packages (`.ci/run` installs them on CI's machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ddlstudy import hosts
from ddlstudy.runfolder import MANIFEST

WHY_NOT = hosts.can_emulate() or hosts.can_slurm()
PREFIX, SUBNET = "stest", "10.86.51"  # nobody else's set (ddl, dtest)
needs_slurm = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
TINY_RUN = ("run", "--usecase", "tiny", "--backend", "mpi", "--epochs", "1", "--max-steps",
            "3", "--max-val-steps", "2", "--sample-hz", "0", "--no-snapshot", "--quiet")


def ddlstudy(*args: str, launcher: tuple[str, ...] = (), code: int = 0,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run([*launcher, sys.executable, "-m", "ddlstudy", *args],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == code, out.stdout[-2000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def slurm():
    """Two hosts and Slurm on them, once: the environment srun and sinfo need."""
    ddlstudy("hosts", "up", "--count", "2", "--prefix", PREFIX, "--subnet", SUBNET)
    try:
        said = ddlstudy("hosts", "slurm", "--prefix", PREFIX).stdout
        conf = hosts.slurm_conf(PREFIX)
        assert f"export SLURM_CONF={conf}" in said
        yield os.environ | {"SLURM_CONF": str(conf)}
    finally:
        ddlstudy("hosts", "down", "--prefix", PREFIX)


def _daemons() -> list[dict]:
    return json.loads((hosts.slurm_conf(PREFIX).parent / "slurm.json").read_text())["daemons"]


@pytest.mark.slow
@needs_slurm
def test_sinfo_sees_each_host_as_an_idle_node_with_its_cpus(slurm):
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c %t %P"], env=slurm,
                         capture_output=True, text=True, check=True).stdout
    cpus = os.cpu_count()
    assert out.splitlines() == [f"stest-h1 {cpus} idle stest*", f"stest-h2 {cpus} idle stest*"]
    # each slurmd runs in its host's network namespace, under the host's name
    task = subprocess.run(["srun", "-N", "2", "-n", "2", "-l", "sh", "-c",
                           "echo $(hostname) $(ip -4 -o addr show dev eth0 | awk '{print $4}')"],
                          env=slurm, capture_output=True, text=True, check=True, timeout=60)
    assert sorted(task.stdout.splitlines()) == ["0: stest-h1 10.86.51.1/24",
                                                "1: stest-h2 10.86.51.2/24"]
    # the controller listens on the bridge's gateway alone
    (ctld,) = [d for d in _daemons() if d["name"] == "slurmctld"]
    listening = {c.laddr.ip for c in psutil.Process(ctld["pid"]).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN}
    assert listening == {"10.86.51.254"}
    status = ddlstudy("hosts", "status", "--prefix", PREFIX).stdout
    assert "Slurm controller stest-gw(10.86.51.254)" in status and "2 idle node(s)" in status


def _losses(runs: Path) -> tuple[dict, list[float]]:
    (folder,) = runs.iterdir()
    manifest = json.loads((folder / MANIFEST).read_text())
    return manifest, [v for e in manifest["epochs"] for v in (e["train_loss"], e["val_loss"])]


@pytest.mark.slow
@needs_slurm
def test_srun_pmi2_trains_as_ddlstudys_own_mpiexec_does(slurm, tmp_path, datasets_dir):
    """2 tasks of srun --mpi=pmi2 on the 2 hosts are one MPI world: the same losses as the
    same run from ddlstudy's mpiexec on the same hosts; the manifest names the step."""
    data = ("--datasets-dir", str(datasets_dir))
    ddlstudy(*TINY_RUN, *data, "--runs-dir", str(tmp_path / "srun"), env=slurm,
             launcher=("srun", "--mpi=pmi2", "-N", "2", "-n", "2"))
    ddlstudy(*TINY_RUN, *data, "--runs-dir", str(tmp_path / "own"), "--nodes", "2",
             "--hosts", f"emulated:{PREFIX}")
    (srun, losses), (own, expected) = _losses(tmp_path / "srun"), _losses(tmp_path / "own")
    assert losses == pytest.approx(expected, abs=1e-4) and len(losses) == 2
    assert srun["backend"]["hosts"] == own["backend"]["hosts"] == ["stest-h1", "stest-h2"]
    step = srun["launch"]["slurm"]
    assert srun["launch"]["launcher"] == "srun" and srun["launch"]["world"] == 2
    assert step["job_id"] >= 1 and step["step_id"] == 0 and step["tasks"] == 2
    assert (step["nodes"], step["node_count"], step["partition"], step["mpi"]) == \
        ("stest-h[1-2]", 2, PREFIX, "pmi2")
    assert "slurm" not in own["launch"]
    # replayed outside srun: refused with the line that replays it; under it: the same run
    original = next((tmp_path / "srun").iterdir())
    refused = ddlstudy("replay", str(original), code=2)
    assert refused.stderr.strip().endswith(
        f"replay it the same way: srun --mpi=pmi2 -N 2 -n 2 ddlstudy replay {original}")
    ddlstudy("replay", str(original), "--runs-dir", str(tmp_path / "replay"), "--quiet",
             env=slurm, launcher=("srun", "--mpi=pmi2", "-N", "2", "-n", "2"))
    replay, again = _losses(tmp_path / "replay")
    assert again == losses and replay["config"]["replay_of"] == srun["id"]
    assert replay["launch"]["slurm"]["job_id"] > step["job_id"]


def test_hosts_slurm_without_the_packages_names_the_install_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ddlstudy", "hosts", "slurm"], text=True,
                         capture_output=True, env=os.environ | {"PATH": str(tmp_path)})
    assert out.returncode == 2 and out.stderr == (
        "ddlstudy: error: hosts slurm: munged, slurmctld, slurmd, srun, sinfo, scontrol not "
        "found; install Slurm and munge: apt-get install slurm-wlm munge\n")


@pytest.mark.slow
@needs_slurm
def test_hosts_down_stops_every_daemon_and_removes_the_files(slurm):
    folder = hosts.slurm_conf(PREFIX).parent
    pids = [d["pid"] for d in _daemons()]
    assert len(pids) == 4 and all(psutil.pid_exists(p) for p in pids)
    said = ddlstudy("hosts", "down", "--prefix", PREFIX).stdout
    assert said.strip() == f"hosts {PREFIX}-h* removed"
    ours = [p for p in psutil.process_iter(["name", "cmdline"])
            if p.info["name"] in ("munged", "slurmctld", "slurmd", "slurmstepd")
            and str(folder) in " ".join(p.info["cmdline"] or [])]
    assert ours == [] and not folder.exists()
    assert not hosts.spec._state_file(PREFIX).exists()
