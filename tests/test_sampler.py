import socket
import subprocess
import sys
import time

from ddlstudy.sampler import COLUMNS, ResourceSampler, samples_frame


def test_rows_have_every_column_and_the_rate():
    with ResourceSampler(20.0, rank=3) as sampler:
        time.sleep(1.0)
    rows = sampler.rows
    assert 15 <= len(rows) <= 22, len(rows)  # 20 Hz for one second
    frame = samples_frame(rows)
    assert list(frame.columns) == list(COLUMNS)
    assert (frame["rank"] == 3).all() and (frame["host"] == socket.gethostname()).all()
    assert (frame["proc_rss_bytes"] > 10 * 2**20).all()  # this Python with torch loaded
    assert (frame["proc_threads"] >= 2).all()  # at least main + sampler thread
    assert frame["t_s"].is_monotonic_increasing
    gaps = frame["t_s"].diff().dropna()
    assert abs(gaps.median() - 0.05) < 0.02
    assert frame["sys_ram_percent"].between(0, 100).all()
    assert (frame["net_sent_bytes"].diff().dropna() >= 0).all()  # cumulative counters


def test_child_processes_are_counted():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with ResourceSampler(10.0) as sampler:
            time.sleep(1.0)
    finally:
        busy.kill()
        busy.wait()
    last = samples_frame(sampler.rows).iloc[-3:]
    assert (last["proc_count"] >= 2).all()
    assert (last["proc_cpu_percent"] > 50).all()  # the busy child spins a whole core


def test_off_takes_no_samples():
    with ResourceSampler(0) as sampler:
        time.sleep(0.2)
    assert sampler.rows == [] and not sampler.enabled
