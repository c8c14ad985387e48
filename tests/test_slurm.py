"""A real Slurm on emulated hosts: munged, slurmctld and a slurmd per host started by
`ddlstudy hosts slurm`, an MPI run across two of them under `srun --mpi=pmi2`, and
`hosts down` leaving none of it behind. Skipped, saying why, without root or without
Slurm's packages (`.ci/run` installs them on CI's machine)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ddlstudy import hosts
from ddlstudy.records.runfolder import MANIFEST

WHY_NOT = hosts.can_emulate() or hosts.can_slurm()
PREFIX, SUBNET = "stest", "10.86.51"  # nobody else's set (ddl, dtest)
needs_slurm = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
TINY_RUN = ("run", "--usecase", "tiny", "--backend", "mpi", "--epochs", "1", "--max-steps",
            "3", "--max-val-steps", "2", "--sample-hz", "0", "--no-snapshot", "--quiet")


def ddlstudy(*args: str, launcher: tuple[str, ...] = (), code: int | None = 0,
             env: dict[str, str] | None = None,
             cwd: Path | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run([*launcher, sys.executable, "-m", "ddlstudy", *args],
                         capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert code is None or out.returncode == code, out.stdout[-2000:] + out.stderr[-3000:]
    return out


MEMORY_MB = 3072
"""Each host's memory (--memory), which its Slurm node has and schedules."""


@pytest.fixture(scope="session")
def slurm():
    """Two hosts of MEMORY_MB each and Slurm on them, once: the environment srun and sinfo
    need. Where the machine's cgroups cannot limit a host's memory, hosts of the machine's
    (``slurm_memory`` then skips)."""
    where = ("--count", "2", "--prefix", PREFIX, "--subnet", SUBNET)
    if ddlstudy("hosts", "up", *where, "--memory", f"{MEMORY_MB}MiB", code=None).returncode:
        ddlstudy("hosts", "down", "--prefix", PREFIX, code=None)
        ddlstudy("hosts", "up", *where)
    try:
        said = ddlstudy("hosts", "slurm", "--prefix", PREFIX).stdout
        conf = hosts.slurm_conf(PREFIX)
        assert f"export SLURM_CONF={conf}" in said
        yield os.environ | {"SLURM_CONF": str(conf)}
    finally:
        ddlstudy("hosts", "down", "--prefix", PREFIX)


@pytest.fixture
def slurm_memory(slurm) -> dict[str, str]:
    """``slurm``, where its hosts are of MEMORY_MB each (else skipped, saying why)."""
    if hosts.load(PREFIX, flag=None).memory is None:
        pytest.skip("the machine's cgroups cannot limit an emulated host's memory")
    return slurm


def _daemons() -> list[dict]:
    return json.loads((hosts.slurm_conf(PREFIX).parent / "slurm.json").read_text())["daemons"]


@pytest.mark.slow
@needs_slurm
def test_sinfo_sees_each_host_as_an_idle_node_with_its_cpus(slurm):
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c %t %P"], env=slurm,
                         capture_output=True, text=True, check=True).stdout
    cpus = os.cpu_count()
    assert out.splitlines() == [f"stest-h1 {cpus} idle stest*", f"stest-h2 {cpus} idle stest*"]
    memory = subprocess.run(["sinfo", "-h", "-N", "-o", "%m"], env=slurm, capture_output=True,
                            text=True, check=True).stdout.split()
    made = hosts.load(PREFIX, flag=None).memory
    assert memory == [str((made or psutil.virtual_memory().total) >> 20)] * 2
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


def _plan(folder: Path, datasets_dir: Path, *cells: str) -> Path:
    """A plan of ``cells`` (TOML bodies) on tiny, as short as a run gets, into ``folder``."""
    folder.mkdir()
    plan = folder / "plan.toml"
    plan.write_text(f"""[study]
name = "{folder.name}"
usecases = ["tiny"]
repeat = 1
runs_dir = "{folder / 'runs'}"

[settings]
epochs = 1
max_steps = 3
max_val_steps = 1
no_snapshot = true
sample_hz = 0
datasets_dir = "{datasets_dir}"
""" + "".join(f"\n[[cells]]\n{c}\n" for c in cells))
    return plan


def _record(plan: Path) -> list[dict]:
    record = json.loads((plan.parent / "runs" / "study.json").read_text())
    assert record["submit"] == "slurm"
    return record["cells"]


def _script(plan: Path, cell: dict) -> tuple[list[str], str]:
    """A cell's batch script: its #SBATCH lines, its last line (the command)."""
    lines = (plan.parent / "runs" / "slurm" / f"{cell['run']}.sbatch").read_text().splitlines()
    return [x.removeprefix("#SBATCH ") for x in lines if x.startswith("#SBATCH ")], lines[-1]


def _resumed_until_done(plan: Path, env: dict, code: int = 0, most_s: float = 240) -> str:
    """`study --resume` again until no cell is queued or running (at most ``most_s``), once
    `squeue` lists none of the study's jobs (a `--resume` imports for seconds)."""
    deadline = time.monotonic() + most_s
    jobs = ",".join({c["job"].split("_")[0] for c in _record(plan) if c["job"]})
    while jobs and subprocess.run(["squeue", "-h", "-j", jobs], env=env, capture_output=True,
                                  text=True).stdout.strip():
        assert time.monotonic() < deadline, f"jobs {jobs} still queued or running"
        time.sleep(1)
    while True:
        out = ddlstudy("study", str(plan), "--resume", env=env, code=None)
        if "queued or running" not in out.stdout:
            assert out.returncode == code, out.stdout + out.stderr[-2000:]
            return out.stdout
        assert out.returncode == 0 and time.monotonic() < deadline, out.stdout
        time.sleep(2)


@pytest.mark.slow
@needs_slurm
def test_a_study_submitted_as_slurm_jobs_is_resumed_and_reported(slurm, tmp_path,
                                                                  datasets_dir):
    """4 cells: the baseline and MPI on 1 node (srun's world: no --nodes flag) share a size,
    so they go as one job array; MPI on 2 nodes is a job of its own; a gpu-data cell (no GPU
    here: the node decides) asks for a GPU this Slurm does not have, and sbatch refuses it.
    --resume reads their states and writes the report."""
    plan = _plan(tmp_path / "jobs", datasets_dir, 'strategy = "sequential"',
                 'strategy = "sequential"\nbackend = "mpi"\nnodes = 2',
                 'strategy = "sequential"\nbackend = "mpi"\nnodes = 1',
                 'strategy = "gpu-data"\ndevices = 1')
    plan.write_text(plan.read_text().replace("repeat = 1\n", 'repeat = 1\nmem_per_node = '
                                             '"0.5GiB"\n').replace(
        "sample_hz = 0\n", "sample_hz = 0\nmlflow = true\n"))
    said = ddlstudy("study", str(plan), "--submit", "slurm", env=slurm, code=1).stdout
    cells = _record(plan)
    assert [(c["strategy"], c["nodes"], c["status"]) for c in cells] == [
        ("sequential", 1, "submitted"), ("sequential", 2, "submitted"),
        ("sequential", 1, "submitted"), ("gpu-data", 1, "failed")]
    jobs = [c["job"] for c in cells]
    array = jobs[0].split("_")[0]
    assert jobs[0] == f"{array}_0" and jobs[2] == f"{array}_1" and jobs[1].isdigit()
    assert cells[3]["reason"].startswith("sbatch refused it: ") and "gres" in cells[3]["reason"]
    assert sorted(line.split(": job ")[1].split()[0] for line in said.splitlines()) == \
        sorted(jobs[:3])  # the array's two first
    runs = plan.parent / "runs"
    for cell, nodes in zip(cells[:3], (1, 2, 1), strict=True):
        sbatch, command = _script(plan, cell)
        assert sbatch == [f"--job-name={cell['run']}", f"--nodes={nodes}",
                          "--ntasks-per-node=1", "--cpus-per-task=1", "--mem=512M",
                          f"--output={runs}/logs/{cell['run']}.log", "--open-mode=append",
                          "--requeue"]
        assert command.startswith("srun --mpi=pmi2 " if cell["backend"] == "mpi" else "exec ")
        assert command.endswith(" -m ddlstudy \"$@\"")
        text = (runs / "slurm" / f"{cell['run']}.sbatch").read_text()
        (run,) = [x for x in text.splitlines() if x.startswith("set -- run ")]
        assert run.startswith("set -- run --quiet --usecase tiny ")
        assert "--nodes" not in run and f"--runs-dir {runs} " in run
    (script,) = (runs / "slurm").glob("array-*.sbatch")
    lines = script.read_text().splitlines()
    assert [x for x in lines if x.startswith("#SBATCH ")] == [
        "#SBATCH --job-name=jobs", "#SBATCH --array=0-1", "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=1", "#SBATCH --mem=512M",
        f"#SBATCH --output={runs}/logs/{cells[0]['run']}_%a.array.log",
        "#SBATCH --open-mode=append", "#SBATCH --requeue"]
    assert lines[-3] == f"scripts=({runs}/slurm/{cells[0]['run']}.sbatch " \
        f"{runs}/slurm/{cells[2]['run']}.sbatch)"
    report = _resumed_until_done(plan, slurm, code=1)
    cells = _record(plan)
    assert [c["status"] for c in cells] == ["completed"] * 3 + ["failed"]
    assert [c["job"] for c in cells] == jobs
    two = json.loads((runs / cells[1]["run"] / MANIFEST).read_text())
    assert two["status"] == "completed" and two["study"]["name"] == "jobs"
    assert str(two["launch"]["slurm"]["job_id"]) == jobs[1] and \
        two["host"]["slurm_partition"] == PREFIX  # the report's setting, not each job's node
    assert (two["launch"]["slurm"]["node_count"], two["backend"]["hosts"]) == \
        (2, ["stest-h1", "stest-h2"])
    one = json.loads((runs / cells[2]["run"] / MANIFEST).read_text())["launch"]["slurm"]
    assert (str(one["array_job_id"]), one["array_task_id"]) == (array, 1)
    assert "mpi 2 nodes" in report and (runs / "report" / "speedup.md").is_file()
    # each job logged its run to the study's MLflow store; the report went into the parent
    from mlflow.tracking import MlflowClient

    from ddlstudy.exports.mlflow.store import PARENT_TAG, RUN_TAG

    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    logged = client.search_runs([client.get_experiment_by_name("jobs").experiment_id])
    assert sorted(r.data.tags[RUN_TAG] for r in logged if RUN_TAG in r.data.tags) == \
        sorted(c["run"] for c in cells[:3])
    (parent,) = [r for r in logged if PARENT_TAG in r.data.tags]
    assert "report/speedup.md" in {a.path for a in client.list_artifacts(parent.info.run_id,
                                                                          "report")}


@pytest.mark.slow
@needs_slurm
def test_a_cancelled_job_is_a_failed_cell_with_slurms_reason(slurm, tmp_path, datasets_dir):
    plan = _plan(tmp_path / "cancel", datasets_dir, 'strategy = "sequential"')
    later = ("--sbatch-arg=--begin=now+1hour", "--time", "5:00")
    ddlstudy("study", str(plan), "--submit", "slurm", *later, env=slurm)
    (cell,) = _record(plan)
    assert _script(plan, cell)[0][-2:] == ["--time=5:00", "--begin=now+1hour"]
    again = ddlstudy("study", str(plan), env=slurm, code=2)  # never run here as well
    assert again.stderr == f"ddlstudy: error: {plan.parent / 'runs'} already holds the jobs " \
        "of study 'cancel'; --resume shows where they stand, --resume --resubmit submits its " \
        "failed cells again\n"
    waiting = ddlstudy("study", str(plan), "--resume", env=slurm).stdout
    assert [line.split() for line in waiting.splitlines() if line.startswith("sequential")] \
        == [["sequential", "tiny", "1", str(cell["job"]), "pending", "BeginTime"]]
    subprocess.run(["scancel", str(cell["job"])], env=slurm, check=True)
    _resumed_until_done(plan, slurm, code=1)
    (failed,) = _record(plan)
    assert (failed["status"], failed["run"], failed["job"]) == ("failed", "", cell["job"])
    assert failed["reason"] == f"Slurm job {cell['job']} CANCELLED (reason: BeginTime)"
    assert (plan.parent / "runs" / "report" / "speedup.md").is_file()
    # --resubmit submits the failed cell again, as a new job into a new run folder
    ddlstudy("study", str(plan), "--resume", "--resubmit", *later, env=slurm)
    (again,) = _record(plan)
    assert again["status"] == "submitted" and int(again["job"]) > int(cell["job"])
    assert again["run"] not in ("", cell["run"])
    subprocess.run(["scancel", str(again["job"])], env=slurm, check=True)


def test_submit_without_slurm_or_its_controller_is_refused_in_one_line(tmp_path,
                                                                       datasets_dir):
    plan = _plan(tmp_path / "refused", datasets_dir, 'strategy = "sequential"')
    out = ddlstudy("study", str(plan), "--submit", "slurm", code=2,
                   env=os.environ | {"PATH": str(tmp_path)})
    assert out.stderr == (
        "ddlstudy: error: --submit slurm: sbatch, scontrol not found; install Slurm's client "
        "commands (apt-get install slurm-client) or run the study here without --submit\n")
    out = ddlstudy("study", str(plan), "--time", "1:00", code=2)
    assert out.stderr == ("ddlstudy: error: --time: an option of Slurm jobs; give it with "
                          "--submit slurm or --resume --resubmit\n")
    if shutil.which("scontrol"):
        out = ddlstudy("study", str(plan), "--submit", "slurm", code=2,
                       env=os.environ | {"SLURM_CONF": str(tmp_path / "none.conf")})
        assert out.stderr == (f"ddlstudy: error: --submit slurm: SLURM_CONF names "
                              f"{tmp_path / 'none.conf'}, which is not a file; set it to your "
                              "cluster's slurm.conf (on emulated hosts, `ddlstudy hosts slurm` "
                              "prints it)\n")
        out = ddlstudy("study", str(plan), "--submit", "slurm", code=2,
                       env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"})
        assert out.stderr.startswith("ddlstudy: error: --submit slurm: Slurm's controller "
                                     "does not answer (") and out.stderr.count("\n") == 1
    assert not (plan.parent / "runs").exists()
    plan.write_text(plan.read_text() + 'mlflow = "http://me:hunter2@127.0.0.1:5000"\n')
    out = ddlstudy("study", str(plan), "--submit", "slurm", code=2)
    assert out.stderr == (
        "ddlstudy: error: --submit slurm: the mlflow URI 'http://127.0.0.1:5000' of a cell on "
        "tiny holds a secret, which its batch script would keep on disk; give the URI without "
        "it, and the credentials as MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in "
        "the environment you submit from (sbatch passes it to the jobs)\n")
    assert not (plan.parent / "runs").exists() and "hunter2" not in out.stdout + out.stderr


@needs_slurm
def test_a_value_slurm_conf_cannot_hold_is_refused_before_anything(tmp_path):
    """Hosts recorded in a folder whose path holds a space: slurm.conf's lines are split at
    spaces (and read by daemons that run as root), so `hosts slurm` refuses in one line and
    writes nothing."""
    env = os.environ | {"DDLSTUDY_HOSTS_DIR": str(tmp_path / "hosts dir")}
    ddlstudy("hosts", "up", "--count", "1", "--prefix", "stconf", "--subnet", "10.86.52",
             env=env)
    try:
        out = ddlstudy("hosts", "slurm", "--prefix", "stconf", env=env, code=2)
        assert out.stderr == (
            f"ddlstudy: error: DDLSTUDY_HOSTS_DIR: '{tmp_path}/hosts dir/stconf-slurm' holds "
            "' ', which Slurm's configuration cannot hold (its lines are key=value pairs "
            "split at spaces); use letters, digits and ._/:@+-\n")
        assert not (tmp_path / "hosts dir" / "stconf-slurm").exists()
    finally:
        ddlstudy("hosts", "down", "--prefix", "stconf", env=env)


def test_hosts_slurm_without_the_packages_names_the_install_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "ddlstudy", "hosts", "slurm"], text=True,
                         capture_output=True, env=os.environ | {"PATH": str(tmp_path)})
    assert out.returncode == 2 and out.stderr == (
        "ddlstudy: error: hosts slurm: munged, slurmctld, slurmd, srun, sinfo, scontrol not "
        "found; install Slurm and munge: apt-get install slurm-wlm munge\n")


def _sbatch(env: dict, *options: str, wrap: str = "sleep 120") -> str:
    return subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *options, "--wrap", wrap],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()


def _job(env: dict, job: str) -> dict[str, str]:
    """What ``scontrol show job`` says of ``job`` (its JobState, Reason, Restarts...)."""
    line = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True,
                          text=True, check=True).stdout
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def _until(what: str, done, most_s: float = 180, every_s: float = 0.5):
    """``done()``'s first true answer, asked every ``every_s`` for at most ``most_s``."""
    deadline = time.monotonic() + most_s
    while not (answer := done()):
        assert time.monotonic() < deadline, f"no {what} within {most_s:.0f} s"
        time.sleep(every_s)
    return answer


@pytest.mark.slow
@needs_slurm
def test_each_node_has_its_hosts_memory_and_slurm_schedules_it(slurm_memory):
    """Hosts of 3 GiB: a job asking more than a node has is refused with Slurm's reason,
    and of two jobs of 2 GiB on one node the second waits for the first (Resources), as on
    a real cluster; without memory in the scheduling (CR_CPU) both ran at once."""
    refused = subprocess.run(["sbatch", "--test-only", f"--mem={MEMORY_MB + 1}M", "--wrap",
                              "true"], env=slurm_memory, capture_output=True, text=True)
    assert refused.returncode != 0
    assert "Requested node configuration is not available" in refused.stderr
    half = f"--mem={MEMORY_MB * 2 // 3}M"
    jobs = [_sbatch(slurm_memory, half, "-w", f"{PREFIX}-h1") for _ in range(2)]
    try:
        first, second = jobs
        _until("first job running", lambda: _job(slurm_memory, first)["JobState"] == "RUNNING")
        waits = _until("a reason to wait", lambda: _job(slurm_memory, second)["Reason"]
                       if _job(slurm_memory, second)["Reason"] != "None" else None, 60)
        assert waits == "Resources" and _job(slurm_memory, second)["JobState"] == "PENDING"
        jobs.append(_sbatch(slurm_memory, "--hold"))  # no --mem: its CPU's share, 1.5 GiB
        assert _job(slurm_memory, jobs[-1])["MinMemoryCPU"] == f"{MEMORY_MB / 2048:.2f}G"
    finally:
        subprocess.run(["scancel", *jobs], env=slurm_memory, check=True)


def test_an_sbatch_option_holding_a_newline_is_refused_before_anything(tmp_path,
                                                                       datasets_dir):
    plan = _plan(tmp_path / "newline", datasets_dir, 'strategy = "sequential"')
    for flags, said in [
            (("--sbatch-arg=--comment=x\ntouch pwned",),
             "--sbatch-arg '--comment=x\\ntouch pwned' holds '\\n'"),
            (("--partition", "cpu\rgpu"), "--partition 'cpu\\rgpu' holds '\\r'")]:
        out = ddlstudy("study", str(plan), "--submit", "slurm", *flags, code=2, cwd=tmp_path)
        assert out.stderr == f"ddlstudy: error: {said}, which a batch script's line cannot " \
            "hold (a newline would end it, and the rest would run as a command in the job); " \
            "give it without\n"
    for flags, said in [(("--warn-before", "60"), "--warn-before: an option of Slurm jobs; "
                         "give it with --submit slurm or --resume --resubmit"),
                        (("--submit", "slurm", "--warn-before", "0"), "--warn-before 0: give "
                         "the seconds before the time limit, from 1 to 65535 (Slurm's "
                         "--signal range)")]:
        out = ddlstudy("study", str(plan), *flags, code=2, cwd=tmp_path)
        assert out.stderr == f"ddlstudy: error: {said}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["newline"]
    assert sorted(p.name for p in plan.parent.iterdir()) == ["plan.toml"]


@pytest.mark.slow
@needs_slurm
def test_a_newline_in_a_plans_value_is_quoted_or_refused(slurm, tmp_path, datasets_dir, tiny):
    """A use case whose path holds a newline and a command: the script quotes it (the job
    trains that use case, runs no command of it), its comment shows it escaped. A runs
    folder holding one, which an #SBATCH line would need, is refused, nothing written (by
    the plan's path checks, before the script's own refusal of any value an #SBATCH line
    cannot hold)."""
    usecase = tmp_path / "tiny\ntouch pwned\n.toml"
    usecase.write_text((Path(__file__).parents[1] / "usecases" / "tiny.toml").read_text())
    plan = _plan(tmp_path / "quoted", datasets_dir, 'strategy = "sequential"')
    plan.write_text(plan.read_text().replace('usecases = ["tiny"]',
                                             f"usecases = [{json.dumps(str(usecase))}]"))
    ddlstudy("study", str(plan), "--submit", "slurm", env=slurm, cwd=tmp_path)
    (cell,) = _record(plan)
    text = (plan.parent / "runs" / "slurm" / f"{cell['run']}.sbatch").read_text()
    assert text.splitlines()[1].startswith(
        f"# ddlstudy study quoted: sequential on {tmp_path}/tiny\\ntouch pwned\\n.toml, ")
    assert f"--usecase '{usecase}' --runs-dir" in text  # the newlines inside the quotes
    assert text.count("\ntouch pwned\n") == 1  # those, data
    _resumed_until_done(plan, slurm)
    assert _record(plan)[0]["status"] == "completed" and not (tmp_path / "pwned").exists()
    bad = _plan(tmp_path / "bad", datasets_dir, 'strategy = "sequential"')
    runs = tmp_path / "bad" / "runs\nsleep 1"
    bad.write_text(bad.read_text().replace(str(tmp_path / "bad" / "runs"),
                                           str(runs).replace("\n", "\\n")))
    out = ddlstudy("study", str(bad), "--submit", "slurm", env=slurm, code=2, cwd=tmp_path)
    assert out.stderr.startswith(f"ddlstudy: error: {bad}, use case tiny, cell ")
    assert out.stderr.endswith(f"{str(runs)!r} holds a control character (a newline, a tab); "
                               "give a plain path (see `ddlstudy run --help`)\n")
    assert out.stderr.count("\n") == 1 and sorted(p.name for p in bad.parent.iterdir()) == \
        ["plan.toml"]


@pytest.mark.slow
@needs_slurm
def test_options_the_controller_refuses_are_refused_before_anything(slurm, tmp_path,
                                                                    datasets_dir):
    """`sbatch --test-only` with the jobs' options first: a partition, an option or a size
    the controller refuses is one line, exit 2, nothing written (each cell failed as a job,
    exit 1, before); --resume --resubmit of a folder never submitted writes nothing."""
    plan = _plan(tmp_path / "asked", datasets_dir, 'strategy = "sequential"')
    for flags, said in [
            (("--partition", "nosuch"), "(--partition=nosuch): invalid partition specified: "
                                        "nosuch"),
            (("--sbatch-arg=--bogus", "--time", "5:00"), "(--time=5:00 --bogus): "
                                                         "unrecognized option '--bogus'")]:
        out = ddlstudy("study", str(plan), "--submit", "slurm", *flags, env=slurm, code=2)
        assert out.stderr.startswith("ddlstudy: error: --submit slurm: Slurm refuses the "
                                     "jobs' options "), out.stderr
        assert out.stderr.removeprefix("ddlstudy: error: --submit slurm: Slurm refuses the "
                                       "jobs' options ").split("\n")[0] == said
    out = ddlstudy("study", str(plan), "--resume", "--resubmit", env=slurm, code=2)
    assert out.stderr == f"ddlstudy: error: --resubmit: {plan.parent / 'runs'} holds no " \
        "study submitted to Slurm; submit it with --submit slurm\n"
    assert sorted(p.name for p in plan.parent.iterdir()) == ["plan.toml"]


def _manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def _held(runs: Path, cells: list[dict]) -> list[int]:
    """Each cell's run stopped (SIGSTOP) once it recorded its first epoch, all watched at
    once: the fault each is given then comes while it trains, however fast it trains."""
    held: dict[str, int] = {}

    def hold() -> bool:
        for cell in cells:
            manifest = _manifest(runs / cell["run"])
            if cell["run"] not in held and manifest and manifest["epochs"]:
                assert manifest["status"] == "running", \
                    f"{cell['run']} ended before it could be held: its epochs are too short"
                os.kill(manifest["pid"], signal.SIGSTOP)
                held[cell["run"]] = manifest["pid"]
        return len(held) == len(cells)

    _until("every run's first epoch", hold, every_s=0.01)
    return [held[c["run"]] for c in cells]


def _every_loss(folder: Path) -> list[float]:
    return [v for e in _manifest(folder)["epochs"] for v in (e["train_loss"], e["val_loss"])]


@pytest.mark.slow
@needs_slurm
def test_a_requeued_or_warned_cell_ends_as_an_uninterrupted_one(slurm, tmp_path, datasets_dir):
    """Four cells that train alike, one job array: one left alone; one requeued (`scontrol
    requeue`) after its first epoch, which goes on from its snapshot; one requeued before
    any snapshot (it writes none), which starts again; one warned by Slurm before its time
    limit (--warn-before: sbatch's --signal=B:USR1), which writes its snapshot at its next
    step and asks Slurm to requeue it. Each run is held still (SIGSTOP) when its fault
    comes, and the warned job's time limit is shortened while it runs (scontrol update), so
    that Slurm's warning comes now rather than in ten minutes. Each ends with the losses of
    the one left alone, in its own folder; `study --resume` shows them requeued meanwhile."""
    plan = _plan(tmp_path / "requeue", datasets_dir, 'strategy = "sequential"',
                 'strategy = "sequential"\nsnapshot_every = 2',
                 'strategy = "sequential"\nno_snapshot = true',
                 'strategy = "sequential"\nsnapshot_every = 4')
    # 10 steps an epoch: 6-7 s between a run's first epoch and its end on a quiet host, in
    # which _held stops it (5 were 3 s, which a busy host's poll missed: the run ended first)
    plan.write_text(plan.read_text().replace("epochs = 1\nmax_steps = 3\n", "epochs = 8\n"
                                             "max_steps = 10\n").replace(
        "no_snapshot = true\nsample_hz", "sample_hz"))
    ddlstudy("study", str(plan), "--submit", "slurm", "--time", "10:00", "--warn-before",
             "120", env=slurm)
    cells = _record(plan)
    alone, again, fresh, warned = cells
    runs = plan.parent / "runs"
    array = alone["job"].split("_")[0]
    assert [c["job"] for c in cells] == [f"{array}_{i}" for i in range(4)]
    assert _script(plan, warned)[0][-3:] == ["--requeue", "--signal=B:USR1@120", "--time=10:00"]
    again_pid, fresh_pid, warned_pid = _held(runs, [again, fresh, warned])
    for cell, pid in ((again, again_pid), (fresh, fresh_pid)):
        subprocess.run(["scontrol", "requeue", cell["job"]], env=slurm, check=True)
        os.kill(pid, signal.SIGCONT)  # its SIGTERM is heard
    subprocess.run(["scontrol", "update", f"JobId={warned['job']}", "TimeLimit=2"], env=slurm,
                   check=True)  # ends within 2 minutes of its start: warned 120 s before
    _until("Slurm's warning", (runs / "slurm" / f"{warned['run']}.stop").exists, 120)
    os.kill(warned_pid, signal.SIGCONT)
    for cell in (again, fresh, warned):
        _until(f"job {cell['job']} requeued", lambda c=cell: (
            _job(slurm, c["job"])["JobState"], _job(slurm, c["job"])["Restarts"]) ==
            ("PENDING", "1"))
    table = ddlstudy("study", str(plan), "--resume", env=slurm).stdout
    shown = {line.split()[3]: line.split(None, 5)[4:] for line in table.splitlines()
             if line.startswith("sequential")}
    for cell, again_from in ((again, "from its snapshot"), (warned, "from its snapshot"),
                             (fresh, "from the start (no snapshot yet)")):
        status, reason = shown[cell["job"]]
        assert status == "requeued" and reason.startswith(
            f"requeued 1x, its run goes on {again_from}; "), table
    subprocess.run(["scontrol", "update", f"JobId={warned['job']}", "TimeLimit=10"],
                   env=slurm, check=True)
    for cell in (again, fresh, warned):  # not after Slurm's hold of requeued jobs (2 min)
        subprocess.run(["scontrol", "update", f"JobId={cell['job']}", "StartTime=now"],
                       env=slurm, check=True)
    _resumed_until_done(plan, slurm)
    assert [(c["status"], c["run"]) for c in _record(plan)] == \
        [("completed", c["run"]) for c in cells]
    # the warned task asked Slurm to requeue itself alone: not its whole array, whose
    # finished cell would have run again (its SLURM_JOB_ID can be the array's ID)
    assert _job(slurm, alone["job"])["Restarts"] == "0"
    expected = _every_loss(runs / alone["run"])
    assert len(expected) == 16 and all(_every_loss(runs / c["run"]) == expected
                                       for c in (again, fresh, warned))
    (resumed,) = _manifest(runs / again["run"])["resumed"]
    assert resumed["from_epoch"] >= 1 and resumed["after"] == {
        "status": "interrupted", "error": "terminated by SIGTERM"}
    (resumed,) = _manifest(runs / warned["run"])["resumed"]
    assert resumed["from_epoch"] >= 1 and resumed["from_step"] >= 1
    assert resumed["after"]["error"].startswith("stopped at a snapshot, as DDLSTUDY_STOP_FILE")
    log = (runs / "logs" / f"{warned['run']}.log").read_text()  # both attempts' output
    assert "stopped at a snapshot" in log and log.rstrip().splitlines()[-1].startswith(
        str(runs / warned["run"]))
    assert "resumed" not in _manifest(runs / fresh["run"])  # started again, its first
    first = _manifest(runs / "slurm" / f"{fresh['run']}.attempt-1")  # attempt kept aside
    assert first["status"] == "interrupted" and first["epochs"]


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
