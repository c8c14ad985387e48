"""Safety through the real command line (issue 52): no secret on disk, no device
overwritten, one writer per folder, plugins that cannot break the rest, stale runs read as
interrupted, a full disk said in one line."""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_extend import install

from ddlstudy.records.runfolder import MANIFEST
from ddlstudy.runner import run as train

PASSWORD = "Pw s3cr/3t@52"  # typed as it is: a space, a slash, an @
TOKEN = "Tk-s3cr3t-52"
QUICK = ("--usecase", "tiny", "--epochs", "1", "--max-steps", "2", "--no-snapshot",
         "--sample-hz", "0")


def cli(*args, cwd: Path | None = None, env: dict | None = None, site: Path | None = None,
        timeout: int = 600, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env or {}))
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    return subprocess.run([*prefix, sys.executable, "-m", "ddlstudy", *args],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)


def one_line(out: subprocess.CompletedProcess) -> str:
    """The refusal: exit 2, one line on stderr, no traceback."""
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr
    return lines[0]


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A tracking server that answers nothing but 401, keeping the credentials sent."""

    seen: list[str] = []

    def _answer(self) -> None:
        self.seen.append(self.headers.get("Authorization") or "")
        self.send_response(401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Recorder.seen = []
    yield f"http://someone:{PASSWORD}@127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


def _holding(root: Path, secret: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_a_password_in_a_tracking_uri_is_used_and_never_written(tmp_path, datasets_dir,
                                                                 server):
    """A study (one run) and an export with a tracking URI holding a password typed
    as it is: the run still trains and records the tracking error; MLflow got the
    credentials (through its own variables: the URI it is handed has none); no file
    written, no output, no uploaded artifact holds the password; a token in the URI's
    query is refused in one line without it."""
    plan, runs = tmp_path / "plan.toml", tmp_path / "study"
    plan.write_text(f'[study]\nname = "sec"\nusecases = ["tiny"]\nrepeat = 1\n'
                    f'[settings]\nepochs = 1\nmax_steps = 2\nno_snapshot = true\nsample_hz = 0\n'
                    f'datasets_dir = "{datasets_dir}"\nmlflow = "{server}"\n'
                    f'[[cells]]\nstrategy = "sequential"\n')
    study = cli("study", str(plan), "--runs-dir", str(runs))
    assert study.returncode == 0, study.stderr[-2000:]
    assert "MLflow (http://127.0.0.1:" in study.stderr  # the error is said, the URI redacted
    credentials = base64.b64encode(f"someone:{PASSWORD}".encode()).decode()
    # the credentials are what connects: every request has them, the run's too (its 401)
    assert _Recorder.seen and all(credentials in sent for sent in _Recorder.seen)
    (manifest,) = runs.glob(f"*/{MANIFEST}")
    m = json.loads(manifest.read_text())
    assert m["status"] == "completed" and "401" in m["mlflow"]["error"]
    shown = f"http://{server.split('@')[-1]}"  # the user info left out, the rest kept
    assert m["config"]["mlflow"] == shown and shown in m["command"]
    store = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    exported = cli("export", "mlflow", str(runs), "--tracking-uri", store)
    assert exported.returncode == 0, exported.stderr[-2000:]
    refused = cli("export", "mlflow", str(runs), "--tracking-uri", server)
    assert "MLflow cannot use tracking URI http://127.0.0.1:" in one_line(refused)
    token = cli("export", "mlflow", str(runs), "--tracking-uri", f"{server}?token={TOKEN}")
    assert "a tracking server's URI takes no query or fragment" in one_line(token)
    assert list((tmp_path / "store" / "mlartifacts").rglob("run-manifest.json"))  # uploaded
    for out in (study, exported, refused, token):
        assert PASSWORD not in out.stdout + out.stderr and TOKEN not in out.stdout + out.stderr
    assert (runs / "study.json").is_file() and list((runs / "logs").glob("*.log"))
    assert _holding(tmp_path, PASSWORD) == [plan]  # only the user's own plan
    assert _holding(tmp_path, TOKEN) == []


def _special(kind: str, path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("making a device node (mknod) needs root")
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    else:
        path.mkdir()


@pytest.mark.parametrize("kind", ["fifo", "socket", "device", "folder"])
def test_force_replaces_no_device_fifo_socket_or_folder(tmp_path, kind):
    """--force may replace a file or a link, nothing else: export model and usecase new
    onto each other kind are refused in one line, and it is left as it was."""
    imgs = tmp_path / "imgs"
    for cls in ("a", "b"):
        (imgs / cls).mkdir(parents=True)
    for name, args in (("model.pt", ["export", "model", str(tmp_path / "no-run"), "--out"]),
                       ("x.toml", ["usecase", "new", "--data-dir", str(imgs), "--out"])):
        target = tmp_path / name
        _special(kind, target)
        before = target.lstat()
        said = one_line(cli(*args, str(target), "--force"))
        assert str(target) in said and ("never replaced" in said or "folder" in said), said
        after = target.lstat()
        assert (after.st_mode, after.st_ino, after.st_rdev) == (
            before.st_mode, before.st_ino, before.st_rdev)


def test_a_runs_folder_whose_name_is_not_utf8_is_refused_in_one_line(tmp_path):
    runs = os.fsencode(tmp_path) + b"/runs-\xff"
    out = subprocess.run([sys.executable, "-m", "ddlstudy", "run", *QUICK, "--runs-dir",
                          runs], capture_output=True, text=True, timeout=300)
    assert "--runs-dir" in one_line(out) and "UTF-8" in out.stderr
    assert not os.path.exists(runs)


BAD_PLUGINS = '''
from ddlstudy.strategies import Strategy


class NoSummary(Strategy):
    name = "no-summary"

    def worker(self, job, link, device):
        pass


class OnlyName:
    name = "only-name"


def a_function():
    return None
'''


def test_a_plugin_of_the_wrong_shape_or_that_exits_is_named_and_left_out(tmp_path,
                                                                          datasets_dir):
    """Entry points whose object is a function, a class with only a name, or a module
    whose import raises SystemExit or KeyboardInterrupt: each named in one warning, left
    out; the listing, a built-in strategy and the good plugin still work."""
    extra = ("fn = bad_plugins:a_function\nonly-name = bad_plugins:OnlyName\n"
             "exits = exits_plugin\nstopped = stopped_plugin\n"
             "no-summary = bad_plugins:NoSummary\n")
    (tmp_path / "site").mkdir()
    site = install(tmp_path / "site", extra)
    (site / "bad_plugins.py").write_text(BAD_PLUGINS)
    (site / "exits_plugin.py").write_text("raise SystemExit(0)\n")
    (site / "stopped_plugin.py").write_text("raise KeyboardInterrupt\n")
    listed = cli("strategies", site=site)
    assert listed.returncode == 0, listed.stderr
    warnings = [line for line in listed.stderr.splitlines() if line.strip()]
    assert len(warnings) == 5 and all("left out" in w for w in warnings), warnings
    said = "\n".join(warnings)
    assert "the function a_function, not a subclass of Strategy" in said
    assert "only-name = bad_plugins:OnlyName" in said and "the class OnlyName, not" in said
    assert "no-summary = bad_plugins:NoSummary" in said and "its summary is None" in said
    assert "SystemExit" in said and "KeyboardInterrupt" in said
    names = [line.split()[0] for line in listed.stdout.splitlines() if line[:1] != " "]
    assert names[0] == "sequential" and names[-1] == "cpu-loaders" and "only-name" not in names \
        and "no-summary" not in names
    runs = tmp_path / "runs"
    for strategy in (["sequential"], ["cpu-loaders"]):
        ran = cli("run", *QUICK, "--datasets-dir", str(datasets_dir), "--runs-dir", str(runs),
                  "--strategy", *strategy, site=site)
        assert ran.returncode == 0, ran.stderr[-2000:]
    assert len(list(runs.glob(f"*/{MANIFEST}"))) == 2
    unknown = cli("run", *QUICK, "--strategy", "exits", site=site)
    assert unknown.returncode == 2 and "unknown strategy 'exits'" in unknown.stderr


def _gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


STUDY = ('[study]\nname = "one"\nusecases = ["tiny"]\nrepeat = 1\n[settings]\nepochs = {epochs}\n'
         'no_snapshot = true\nsample_hz = 0\ndatasets_dir = "{data}"\n'
         '[[cells]]\nstrategy = "sequential"\n')


def test_one_study_at_a_time_in_a_folder_and_a_lock_left_by_a_killed_one(tmp_path,
                                                                          datasets_dir):
    """A second study on a folder in use is refused, naming the first's PID and command;
    once the first is killed (SIGKILL: it cannot release its lock), the next takes its
    lock over and says so."""
    plan, runs = tmp_path / "plan.toml", tmp_path / "runs"
    plan.write_text(STUDY.format(epochs=10000, data=datasets_dir))
    first = subprocess.Popen([sys.executable, "-m", "ddlstudy", "study", str(plan),
                              "--runs-dir", str(runs), "--quiet"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        lock = runs / ".ddlstudy.lock"
        # the lock taken and the first cell's run begun (a folder of its): the third study
        # below is refused for the runs it finds, however soon after its start it is killed
        while not (lock.is_file() and lock.read_text() and any(runs.glob("*/manifest.json"))):
            assert first.poll() is None, "the first study ended early"
            time.sleep(0.2)  # waits for what it needs, asserts no timing
        said = one_line(cli("study", str(plan), "--runs-dir", str(runs), "--resume"))
        assert f"PID {first.pid} " in said and "in use by another study" in said
        assert "study" in said.split("(", 1)[1]  # its command
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    third = cli("study", str(plan), "--runs-dir", str(runs))  # refused: it holds runs
    assert f"took over the lock left by PID {first.pid} " in third.stderr
    assert third.returncode == 2 and "already holds runs of study 'one'" in third.stderr


def test_two_runs_given_one_run_id_one_is_refused(tmp_path, datasets_dir):
    """Two runs started at once with one DDLSTUDY_RUN_ID: one runs, the other is refused
    in one line (whichever comes second, before or after the other made its folder). (Two
    exports at once into one new store: test_mlflow's, into SQLite and a server.)"""
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "ddlstudy", "run", *QUICK, "--datasets-dir",
           str(datasets_dir), "--runs-dir", str(runs)]
    env = dict(os.environ, DDLSTUDY_RUN_ID="same-id")
    both = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    ended = sorted((p.wait(timeout=600), p.stderr.read()) for p in both)
    for p in both:
        p.stdout.close()
        p.stderr.close()
    assert [code for code, _ in ended] == [0, 2], ended
    assert "same-id already exists" in ended[1][1] and "Traceback" not in ended[1][1]
    (folder,) = runs.iterdir()
    assert folder.name == "same-id" and \
        json.loads((folder / MANIFEST).read_text())["status"] == "completed"


def test_a_run_whose_process_is_gone_reads_as_interrupted_and_resume_reruns_it(
        tmp_path, datasets_dir):
    """A study's run left "running" by a process that is gone: the report counts it
    interrupted (not running), export logs it KILLED, and study --resume runs its cell
    again."""
    plan, runs = tmp_path / "plan.toml", tmp_path / "runs"
    plan.write_text(STUDY.format(epochs=1, data=datasets_dir))
    assert cli("study", str(plan), "--runs-dir", str(runs), "--quiet").returncode == 0
    (file,) = runs.glob(f"*/{MANIFEST}")
    m = json.loads(file.read_text())
    m.update(status="running", ended_at=None, exit_code=None, pid=_gone_pid())
    file.write_text(json.dumps(m))  # as a SIGKILLed run leaves it
    report = cli("report", str(runs))
    assert report.returncode == 0 and "running" not in report.stdout, report.stdout
    assert "interrupted" in report.stdout
    store = f"sqlite:///{tmp_path / 'store.db'}"
    assert cli("export", "mlflow", str(runs), "--tracking-uri", store).returncode == 0
    from mlflow import MlflowClient

    (run,) = MlflowClient(tracking_uri=store).search_runs(
        [e.experiment_id for e in MlflowClient(tracking_uri=store).search_experiments()],
        f"tags.ddlstudy_run_id = '{m['id']}'")
    assert run.info.status == "KILLED"
    resumed = cli("study", str(plan), "--runs-dir", str(runs), "--resume", "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    cells = json.loads((runs / "study.json").read_text())["cells"]
    assert [c["status"] for c in cells] == ["completed"] and cells[0]["run"] != m["id"]
    assert json.loads(file.read_text())["status"] == "running"  # read as, not rewritten


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs inside the test's folder (root only), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def _fill(mnt: Path, leave: int = 0) -> None:
    """Fill ``mnt`` but ``leave`` bytes."""
    with open(mnt / "filler", "wb") as f:
        try:
            left = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize - leave
            f.write(b"\0" * max(left, 0))
            f.flush()
        except OSError:
            pass


def _half_written(mnt: Path) -> list[Path]:
    return [p for p in mnt.rglob("*") if p.name != "filler" and (
        ".tmp-" in p.name or (p.is_file() and p.stat().st_size == 0))]


def test_a_full_disk_outside_run_is_said_in_one_line(tmp_path, datasets_dir, small_disk,
                                                     tiny, quick_config):
    """dataset make, usecase new, export model, report --out and run --mlflow onto a full
    disk: one line, exit 2, nothing half-written left."""
    made = train(quick_config(max_steps=2), show_progress=False)  # in this process: set-up
    runs, run = made.path.parent, made.path
    assert runs == tmp_path / "runs" and (run / "snapshot.pt").is_file()
    said = one_line(cli("dataset", "make", "--usecase", "tiny", "--out",
                        str(small_disk / "tiny")))  # 1 MiB holds no data set
    assert "the disk is full" in said and not list(small_disk.iterdir())
    _fill(small_disk)
    for args, out in ((["usecase", "new", "--data-dir", str(datasets_dir / tiny.data.name),
                        "--model", "alexnet", "--image-size", "64", "--out"], "x.toml"),
                      (["export", "model", str(run), "--out"], "model.pt"),
                      (["run", *QUICK, "--datasets-dir", str(datasets_dir), "--mlflow",
                        "--runs-dir"], "runs")):
        ended = cli(*args, str(small_disk / out))
        said = ended.stderr.strip().splitlines()[-1]  # run --mlflow: MLflow's warning first
        assert ended.returncode == 2 and "Traceback" not in ended.stderr, ended.stderr[-2000:]
        assert "No space left on device" in said and "free some space" in said, said
        assert not (small_disk / out).exists() or out == "runs" and not list(
            (small_disk / out).glob("*/")), out  # no run folder without its manifest
    (small_disk / "filler").unlink()
    _fill(small_disk, leave=24 * 1024)  # the tables fit, the figures do not
    report = cli("report", str(runs), "--out", str(small_disk / "report"))
    assert "No space left on device" in one_line(report)
    assert not _half_written(small_disk)


MODELS = Path(__file__).parent / "models" / "own_net.py"


def test_a_factory_that_changes_the_working_directory_moves_no_output(tmp_path,
                                                                       datasets_dir):
    """A relative --runs-dir is taken from where the command started, whatever the model
    factory does to the working directory."""
    here, away = tmp_path / "here", tmp_path / "away"
    here.mkdir()
    away.mkdir()
    ran = cli("run", *QUICK, "--datasets-dir", str(datasets_dir), "--runs-dir", "runs",
              "--model", f"{MODELS}:moves_away", cwd=here, env={"MOVE_TO": str(away)})
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert len(list((here / "runs").glob("*/" + MANIFEST))) == 1
    assert not list(away.iterdir())
    assert "changed the working directory" in ran.stderr


def test_a_study_cell_whose_set_up_never_ends_fails_and_the_study_goes_on(tmp_path,
                                                                          datasets_dir):
    """A cell whose model factory never returns is a failed cell once [study]
    setup_timeout_s has passed; the baseline cell still trains."""
    plan = tmp_path / "hang.toml"
    plan.write_text(f"""[study]
usecases = ["tiny"]
repeat = 1
setup_timeout_s = 10
[settings]
epochs = 1
max_steps = 2
sample_hz = 0
no_snapshot = true
datasets_dir = "{datasets_dir}"
[[cells]]
strategy = "sequential"
model = "{MODELS}:never_returns"
""")
    runs = tmp_path / "runs"
    ended = cli("study", str(plan), "--runs-dir", str(runs), "--quiet", timeout=300)
    assert ended.returncode == 1, ended.stderr[-2000:]
    assert "Traceback" not in ended.stderr
    cells = json.loads((runs / "study.json").read_text())["cells"]
    assert [c["status"] for c in cells] == ["completed", "failed"], cells
    assert "took longer than 10 s (the set-up time limit)" in cells[1]["reason"]
    assert "setup_timeout_s" in cells[1]["reason"] and cells[1]["run"] == ""
    assert len(list(runs.glob("*/" + MANIFEST))) == 1


@pytest.fixture
def plain_user() -> tuple[str, ...]:
    """A command prefix under which file permissions hold for this user: as root (the CI
    too), root without the two capabilities that override them (util-linux's setpriv)."""
    if os.geteuid() != 0:
        return ()
    caps = "-dac_override,-dac_read_search"
    prefix = ("setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}")
    if shutil.which("setpriv") is None or subprocess.run([*prefix, "true"]).returncode:
        pytest.skip("root reads and writes any folder, and setpriv cannot drop that here")
    return prefix


def test_an_unreadable_class_folder_is_said_to_be_unreadable(tmp_path, imagefolder,
                                                             plain_user):
    (imagefolder / "fire").chmod(0)
    try:
        said = one_line(cli("run", "--data-dir", str(imagefolder), "--model",
                            f"{MODELS}:small_resnet", "--runs-dir", str(tmp_path / "runs"),
                            "--epochs", "1", "--max-steps", "2", prefix=plain_user))
    finally:
        (imagefolder / "fire").chmod(0o755)
    assert f"folder {imagefolder / 'fire'} cannot be read (Permission denied)" in said
    assert "holds no images" not in said and not (tmp_path / "runs").exists()
    (imagefolder / "SHA256SUMS").chmod(0)  # the set's list of sums: said, not OSError
    said = one_line(cli("run", "--data-dir", str(imagefolder), "--model",
                        f"{MODELS}:small_resnet", "--runs-dir", str(tmp_path / "runs"),
                        "--epochs", "1", "--max-steps", "2", prefix=plain_user))
    assert "SHA256SUMS" in said and "permissions" in said and not (tmp_path / "runs").exists()


def test_advise_out_elsewhere_leaves_an_unwritable_working_directory_alone(tmp_path,
                                                                           datasets_dir,
                                                                           plain_user):
    """advise --out DIR checks DIR, not the working directory's runs/: the refusal that
    comes is the next one (a bad --link), and nothing is written anywhere."""
    cwd = tmp_path / "read-only"
    cwd.mkdir()
    cwd.chmod(0o555)
    env = {k: v for k, v in os.environ.items() if k != "DDLSTUDY_HOME"}
    try:
        ended = subprocess.run([*plain_user, sys.executable, "-m", "ddlstudy", "advise",
                                "--usecase", "tiny", "--datasets-dir", str(datasets_dir),
                                "--out", str(tmp_path / "out"),
                                "--link", "fast"], capture_output=True, text=True, env=env,
                               cwd=cwd, timeout=300)
    finally:
        cwd.chmod(0o755)
    assert "--link: 'fast'" in one_line(ended)
    assert not list(cwd.iterdir()) and not (tmp_path / "out").exists()
