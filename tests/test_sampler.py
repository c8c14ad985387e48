import socket
import subprocess
import sys
import time

import psutil

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
    """A spinning child is in the tree's count and its CPU: the sampled CPU % agrees with
    the CPU time the child really got over the same second (on a busy machine it gets less
    than a core, and the samples say so)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    child = psutil.Process(busy.pid)
    try:
        time.sleep(0.3)  # past the interpreter's start
        with ResourceSampler(10.0) as sampler:
            start, cpu0 = time.time(), sum(child.cpu_times()[:2])
            time.sleep(1.5)
            end, cpu1 = time.time(), sum(child.cpu_times()[:2])
    finally:
        busy.kill()
        busy.wait()
    frame = samples_frame(sampler.rows)
    window = frame[(frame["time"] > start + 0.2) & (frame["time"] <= end)]
    assert len(window) >= 5 and (window["proc_count"] >= 2).all()
    got = 100 * (cpu1 - cpu0) / (end - start)
    assert got > 5  # the child ran
    sampled = window["proc_cpu_percent"].mean()
    assert abs(sampled - got) < max(20, 0.35 * got), (sampled, got)


def test_off_takes_no_samples():
    with ResourceSampler(0) as sampler:
        time.sleep(0.2)
    assert sampler.rows == [] and not sampler.enabled
