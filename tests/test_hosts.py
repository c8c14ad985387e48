"""Several hosts for real: network namespaces joined by veth pairs on a bridge, MPI ranks
and Spark workers on them, every byte between them crossing a (shapeable) link."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from ddlstudy import hosts
from ddlstudy.cli import main
from ddlstudy.hosts import namespaces, spec
from ddlstudy.records.runfolder import MANIFEST, SAMPLES
from ddlstudy.runner import run as train

WHY_NOT = hosts.can_emulate()
needs_hosts = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
PREFIX, SUBNET = "dtest", "10.78.0"  # not the user's default set (ddl, 10.77.0)


@pytest.fixture(scope="module")
def three_hosts():
    made = hosts.up(3, prefix=PREFIX, subnet=SUBNET)
    yield made
    hosts.down(PREFIX)
    assert not hosts.spark_secret_file(PREFIX).parent.exists()  # Spark's secret and logs too


def _run(tmp_path, datasets_dir, *flags: str) -> tuple[dict, pd.DataFrame]:
    runs = tmp_path / "runs"
    out = subprocess.run([sys.executable, "-m", "ddlstudy", "run", "--usecase", "tiny",
                          "--datasets-dir", str(datasets_dir), "--runs-dir", str(runs),
                          "--no-snapshot", "--quiet", "--epochs", "2", *flags],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (folder,) = runs.iterdir()
    return json.loads((folder / MANIFEST).read_text()), pd.read_parquet(folder / SAMPLES)


@pytest.fixture(scope="module")
def plain_on_two_hosts(tmp_path_factory, datasets_dir, three_hosts):
    """2 MPI ranks on 2 of the hosts, 2 epochs, sampled at 20 Hz, nothing compressed and
    the batches cut equally: the run the compressed and the balanced runs are held to,
    run once: (manifest, samples)."""
    return _run(tmp_path_factory.mktemp("plain"), datasets_dir, "--backend", "mpi",
                "--nodes", "2", "--hosts", f"emulated:{PREFIX}", "--sample-hz", "20")


def _curve(manifest: dict) -> list[float]:
    """Every epoch's training loss and validation accuracy, in one list."""
    return [v for e in manifest["epochs"] for v in (e["train_loss"], e["val_accuracy"])]


def _sent_per_step(manifest: dict, samples: pd.DataFrame) -> pd.Series:
    """Bytes each rank's host sent per training step, from its sampled counters."""
    steps = sum(e["steps"] for e in manifest["epochs"])
    sent = samples.groupby("rank")["net_sent_bytes"]
    return (sent.max() - sent.min()) / steps


@needs_hosts
def test_the_hosts_are_separate_machines_on_one_network(three_hosts):
    assert three_hosts.addresses == ["10.78.0.1", "10.78.0.2", "10.78.0.3"]
    out = three_hosts.run_on(2, ["sh", "-c", "hostname; ip -o -4 addr show dev eth0; "
                                 "getent hosts dtest-h3"], capture_output=True, text=True)
    name, addr, peer = out.stdout.splitlines()
    assert name == "dtest-h2" and "10.78.0.2/24" in addr and peer.split()[0] == "10.78.0.3"
    # host 3 reaches host 1 over TCP through the bridge
    probe = ("import socket; s = socket.create_connection(('10.78.0.1', 5999), timeout=5); "
             "print(s.recv(2).decode())")
    server = subprocess.Popen([str(three_hosts.launcher), "10.78.0.1",
                               f"{sys.executable} -c \"import socket; l = socket.create_server(("
                               f"'10.78.0.1', 5999)); c, _ = l.accept(); c.send(b'ok')\""])
    try:
        for _ in range(50):
            client = three_hosts.run_on(3, [sys.executable, "-c", probe], capture_output=True,
                                        text=True)
            if client.returncode == 0:
                break
        assert client.stdout.strip() == "ok"
    finally:
        server.kill()


@pytest.mark.slow
@needs_hosts
def test_mpi_across_hosts_trains_like_one_host_and_crosses_the_network(
        tmp_path, datasets_dir, three_hosts):
    """3 ranks on 3 hosts against 3 ranks on this host: the same weights step by step
    (the same allreduce, other transport); the gradients cross each host's link."""
    spread, samples = _run(tmp_path / "a", datasets_dir, "--backend", "mpi", "--nodes", "3",
                           "--hosts", f"emulated:{PREFIX}", "--sample-hz", "20")
    local, _ = _run(tmp_path / "b", datasets_dir, "--backend", "mpi", "--nodes", "3",
                    "--sample-hz", "0")
    assert spread["backend"]["hosts"] == ["dtest-h1", "dtest-h2", "dtest-h3"]
    assert spread["config"]["hosts"] == "emulated:dtest"
    assert _curve(spread) == pytest.approx(_curve(local), rel=1e-5)
    gradient_bytes = 4 * sum(p.numel() for p in _tiny_model().parameters())
    per_step = _sent_per_step(spread, samples)
    assert sorted(per_step.index) == [0, 1, 2]
    # an allreduce over 3 nodes sends at least 2/3 of the buffer from every node
    assert (per_step > 0.6 * gradient_bytes).all(), per_step


def _tiny_model():
    from ddlstudy.config import load_usecase
    from ddlstudy.models import build_model

    uc = load_usecase("tiny")
    return build_model(uc.model, len(uc.classes))


@pytest.mark.slow
@needs_hosts
def test_compressed_bytes_reported_are_the_bytes_on_the_wire(tmp_path, datasets_dir,
                                                             three_hosts, plain_on_two_hosts):
    """--compress reports what it sends a step; the sampled counters of each host agree
    within 10 % (the 20 Hz samples miss the edges of a 1 s run; 2 nodes:
    each sends its compressed buffer once a step), and fp16 halves the plain exchange."""
    plain, plain_samples = plain_on_two_hosts
    for method in ("fp16", "topk:0.01"):
        manifest, samples = _run(tmp_path / method.replace(":", ""), datasets_dir, "--backend",
                                 "mpi", "--nodes", "2", "--hosts", f"emulated:{PREFIX}",
                                 "--sample-hz", "20", "--compress", method)
        reported = manifest["backend"]["compress"]["bytes_sent_per_step"]
        measured = _sent_per_step(manifest, samples)
        assert ((measured > 0.9 * reported) & (measured < 1.1 * reported)).all(), \
            (method, reported, measured.tolist())
    plain_per_step = _sent_per_step(plain, plain_samples)
    assert (plain_per_step > 0.9 * manifest["backend"]["compress"]["uncompressed_bytes"]).all()


@pytest.mark.slow
@needs_hosts
def test_a_slower_link_slows_the_same_training(tmp_path, datasets_dir, three_hosts):
    """tbf caps each host's link at 200 Mbit/s: the same run gives the same weights and
    waits at least bytes / rate for its gradients each step."""
    slow = hosts.up(2, prefix="dslow", subnet="10.79.0", rate="200mbit")
    try:
        manifest, samples = _run(tmp_path, datasets_dir, "--backend", "mpi", "--nodes", "2",
                                 "--hosts", "emulated:dslow", "--sample-hz", "10",
                                 "--max-steps", "4", "--epochs", "1")
    finally:
        hosts.down(slow.prefix)
    fast, _ = _run(tmp_path / "fast", datasets_dir, "--backend", "mpi", "--nodes", "2",
                   "--hosts", f"emulated:{PREFIX}", "--sample-hz", "0", "--max-steps", "4",
                   "--epochs", "1")
    assert _curve(manifest) == pytest.approx(_curve(fast), rel=1e-5)
    sent = _sent_per_step(manifest, samples).max() * 4
    floor = sent * 8 / hosts.rate_bits("200mbit")
    assert manifest["epochs"][0]["train_time_s"] >= floor, (sent, floor)


@pytest.mark.slow
@needs_hosts
@pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java")
def test_spark_standalone_across_hosts_trains_like_local_spark(tmp_path, datasets_dir,
                                                               three_hosts, quick_config):
    master = hosts.spark_up(three_hosts, cores=1)
    try:
        secret = hosts.spark_secret_file(PREFIX)
        assert secret.stat().st_mode & 0o077 == 0  # this user's alone
        spread, _ = _run(tmp_path / "a", datasets_dir, "--backend", "spark", "--nodes", "2",
                         "--spark-master", master, "--spark-secret-file", str(secret),
                         "--sample-hz", "0", "--epochs", "1")
        master_log = (secret.parent / "master-h1.log").read_text()
        assert "authentication enabled" in master_log
    finally:
        hosts.spark_down(PREFIX)
    # Spark's gloo mode is two local processes' DDP to the bit (test_spark): held to an
    # epoch of those (this file's tests run alone: no other test shares 20 epochs of them)
    local = train(quick_config(strategy="cpu-processes", workers=2, epochs=1),
                  show_progress=False).manifest
    tasks = spread["backend"]["tasks"]
    assert len({t["host"] for t in tasks}) == 2
    assert {t["host"] for t in tasks} <= set(three_hosts.names)
    assert len(spread["epochs"]) == 1
    assert _curve(spread) == _curve(local | {"epochs": local["epochs"][:1]})


@pytest.mark.slow
@needs_hosts
def test_balance_gives_the_faster_host_the_larger_slice(tmp_path, datasets_dir,
                                                       plain_on_two_hosts):
    """Host 2 may use 0.3 of a core, host 1 a whole one: --balance throughput measures
    each host's speed and cuts the later global batches in proportion, covering every
    image still; the run learns as the equal split does (the plain run's: the equal split
    of 2 ranks trains the same wherever its hosts are, and the same on hosts this slow,
    only later). (On a busy machine host 1 gets less than its core, so the measured ratio,
    not 1 : 0.3, is what the shares follow.)"""
    unequal = hosts.up(2, prefix="dcpu", subnet="10.80.0", cpus=[1.0, 0.3])
    try:
        throughput, _ = _run(tmp_path, datasets_dir, "--backend", "mpi", "--nodes", "2",
                             "--hosts", "emulated:dcpu", "--balance", "throughput",
                             "--sample-hz", "0", "--epochs", "2")
    finally:
        hosts.down(unequal.prefix)
    runs = {"equal": plain_on_two_hosts[0], "throughput": throughput}
    assert runs["equal"]["config"]["balance"] == "equal"
    balance = runs["throughput"]["backend"]["balance"]
    assert "balance" not in runs["equal"]["backend"]
    fast, slow = balance["compute_images_per_s"]
    assert fast > slow, balance
    assert balance["shares"][0] == pytest.approx(fast / (fast + slow), abs=1e-3)
    assert sum(balance["shares"]) == pytest.approx(1, abs=1e-3)
    assert [e["train_images"] for e in runs["throughput"]["epochs"]] == [240] * 2
    losses = {b: m["epochs"][-1]["train_loss"] for b, m in runs.items()}
    assert losses["throughput"] == pytest.approx(losses["equal"], rel=0.1), losses


@pytest.mark.parametrize("args, message", [
    (["hosts", "up", "--count", "0", "--prefix", "dbad"], "--count: 0 hosts"),
    (["hosts", "up", "--prefix", "Bad-Name"], "--prefix: 'Bad-Name'"),
    (["hosts", "up", "--subnet", "192.168.1", "--prefix", "dbad"], "private 10.x.y"),
    (["hosts", "up", "--rate", "fast", "--prefix", "dbad"], "--rate: 'fast'"),
    (["hosts", "spark", "--prefix", "dnone"], "no emulated hosts named 'dnone' are up"),
    (["run", "--usecase", "tiny", "--backend", "mpi", "--nodes", "2",
      "--hosts", "emulated:dnone"], "no emulated hosts named 'dnone'"),
    (["run", "--usecase", "tiny", "--hosts", "a,b"], "--hosts: places MPI ranks"),
    (["hosts", "up", "--count", "2", "--cpus", "1", "--prefix", "dbad"], "one CPU share"),
    (["hosts", "up", "--cpus", "1,x", "--prefix", "dbad"], "--cpus: '1,x'"),
    (["run", "--usecase", "tiny", "--balance", "throughput"], "it needs --backend mpi"),
    (["run", "--usecase", "tiny", "--backend", "mpi", "--balance", "fast"], "equal, throughput"),
    (["run", "--usecase", "tiny", "--backend", "mpi", "--hosts", "a,,b"], "separated by"),
    (["hosts", "up", "--prefix", "dbad\n"], "--prefix: 'dbad\\n'"),
    (["hosts", "down", "--prefix", "dbad\n"], "--prefix: 'dbad\\n'"),
    (["hosts", "status", "--prefix", "dbad\n"], "--prefix: 'dbad\\n'"),
    (["hosts", "up", "--rate", "1gbit\n", "--prefix", "dbad"], "--rate: '1gbit\\n'"),
    (["hosts", "up", "--subnet", "10.77.0\n", "--prefix", "dbad"], "private 10.x.y"),
])
def test_bad_hosts_input(tmp_path, capsys, args, message):
    if args[0] == "run":
        args = [*args, "--runs-dir", str(tmp_path / "runs")]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert "dbad-h1" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                           text=True).stdout


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """A folder of its own for the hosts' state files (not the user's /run/ddlstudy)."""
    folder = tmp_path / "state"
    monkeypatch.setattr(spec, "STATE_DIR", folder)
    return folder


def _links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


@pytest.fixture
def hand_made_bridge():
    """zzbr0, made as a user or another tool (libvirt's virbr0) makes one: not ddlstudy's."""
    if WHY_NOT is not None:
        pytest.skip(WHY_NOT)
    made = subprocess.run(["ip", "link", "add", "zzbr0", "type", "bridge"],
                          capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot make a bridge here: {made.stderr.strip()}")
    try:
        yield "zzbr0"
    finally:
        subprocess.run(["ip", "link", "del", "zzbr0"], capture_output=True)


def test_down_leaves_what_ddlstudy_did_not_make(state_dir, capsys, hand_made_bridge):
    assert main(["hosts", "down", "--prefix", "zz"]) == 0
    assert capsys.readouterr().out == ("no emulated hosts with prefix zz were made by "
                                       "ddlstudy; nothing deleted\n")
    assert "zzbr0:" in _links()


def test_up_refuses_to_adopt_a_bridge_it_did_not_make(state_dir, capsys, hand_made_bridge):
    assert main(["hosts", "up", "--count", "1", "--prefix", "zz"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "zzbr0 already exist" in err
    assert "zzbr0:" in _links() and "zz-v1" not in _links()
    assert "zz-h1" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                         text=True).stdout
    assert not (state_dir / "zz.json").exists()
    assert main(["hosts", "down", "--prefix", "zz"]) == 0  # still not ddlstudy's to delete
    assert "zzbr0:" in _links()


@needs_hosts
def test_a_half_made_set_is_taken_down_from_its_record(state_dir, capsys, monkeypatch):
    """up stops after the hosts' links (as if killed): its record lists each thing made,
    and down removes them all, the record last."""
    def crash(_hosts):
        raise RuntimeError("killed")

    monkeypatch.setattr(namespaces, "_shape", crash)
    with pytest.raises(RuntimeError):
        hosts.up(2, prefix="dhalf", subnet="10.82.0")
    record = json.loads((state_dir / "dhalf.json").read_text())
    assert record["complete"] is False
    assert record["made"]["namespaces"] == ["dhalf-h1", "dhalf-h2"]
    assert record["made"]["veths"] == ["dhalf-v1", "dhalf-v2"]
    assert record["made"]["bridges"] == ["dhalfbr0"]
    assert main(["hosts", "spark", "--prefix", "dhalf"]) == 2
    assert "were not fully made" in capsys.readouterr().err
    assert main(["hosts", "down", "--prefix", "dhalf"]) == 0
    assert "dhalf" not in _links()
    assert "dhalf" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                         text=True).stdout
    assert not list(state_dir.iterdir())


def test_status_with_no_hosts_up_is_an_answer(state_dir, capsys):
    assert main(["hosts", "status"]) == 0
    assert capsys.readouterr().out == "no emulated hosts are up\n"


_HOSTS = {"prefix": "zz", "count": 1, "subnet": "10.77.0", "delay": None, "rate": None,
          "cpus": None}
_MADE = {"namespaces": [], "veths": [], "bridges": [], "etc": [], "cgroups": [], "files": []}


@pytest.mark.parametrize("content", [
    "not json {",
    json.dumps([1, 2]),
    json.dumps({"hosts": _HOSTS | {"count": "1"}, "complete": True, "made": _MADE}),
    json.dumps({"hosts": _HOSTS, "complete": True, "made": _MADE | {"bridges": ["virbr0"]}}),
    json.dumps({"hosts": _HOSTS, "complete": True, "made": _MADE | {"cgroups": ["/"]}}),
    json.dumps(_HOSTS),  # the record of an older ddlstudy: what it made is unknown
    None,  # a FIFO: read, it would wait for a writer for ever
])
@pytest.mark.parametrize("command", ["down", "status", "up"])
def test_a_damaged_state_file_is_refused_in_one_line(state_dir, capsys, content, command):
    if command == "up" and WHY_NOT is not None:
        pytest.skip(WHY_NOT)  # up stops at that first
    state_dir.mkdir()
    path = state_dir / "zz.json"
    if content is None:
        os.mkfifo(path)
    else:
        path.write_text(content)
    assert main(["hosts", command, "--prefix", "zz"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "delete" in err, err
    assert "Traceback" not in err and os.path.lexists(path)
