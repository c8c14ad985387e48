"""A training process's allocator starts as it would end once warm: tensors freed and made
again come from the heap, not from pages mapped, faulted in and unmapped each time; with
``--heap keep``, the large ones too."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

from ddlstudy.config import PROBE_SECONDS, REFAULT_PROBE_SECONDS, load_usecase
from ddlstudy.machine.environment import HUGE_PAGES, free_page_reporting, python_module
from ddlstudy.models import facts
from ddlstudy.records.runfolder import load_manifest
from ddlstudy.tools.advise.checking import summary_lines
from ddlstudy.tools.advise.memory import probe_box, refault_note, refaults

PAGE = 4096
SIZES_MIB = range(1, 25)
BIG_MIB = (64, 144)
"""Blocks over glibc's largest mmap threshold (32 MiB), as AlexNet's 67 and 151 MB layers'."""
STEPS = 10
OWN = Path(__file__).parent / "models" / "own_net.py"

CODE = f"""
import resource, torch
from ddlstudy.training import memory

def faults(sizes):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for mib in sizes:  # a step's tensors, each freed
        t = torch.empty(mib << 18).fill_(1.0)
        del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def again(sizes):
    faults(sizes)  # the heap grows to the largest
    return faults(sizes)  # the next step

# glibc's threshold as a cold process starts with it (128 KiB), held there: where a
# process's start left its sliding threshold varies (compiling the .pyc files of a fresh
# clone raised it past these blocks)
memory._LIBC.mallopt(memory.M_MMAP_THRESHOLD, 128 << 10)
cold = faults({list(SIZES_MIB)!r})
memory.steady_heap()
steady = again({list(SIZES_MIB)!r})
big = again({list(BIG_MIB)!r})
memory.steady_heap(keep=True)
print(cold, steady, big, again({list(BIG_MIB)!r}))
"""


def test_a_steady_heap_does_not_fault_in_each_new_tensor_afresh():
    """At a cold glibc's threshold, each block is mapped and every page of it faulted in
    (1 + 2 + ... + 24 MiB: 76,800 pages; measured 76,628-76,824); after ``steady_heap``
    they come from the heap again: the next step's faults in none. Blocks over 32 MiB are
    mapped afresh each step whatever glibc's threshold (64 + 144 MiB: 53,248 pages), but
    not once the heap keeps them (``steady_heap(keep=True)``, ``--heap keep``)."""
    # torch's huge pages (a run's command turns them on: environment.use_huge_pages, as a
    # test before this one may have) count a fault a 2 MiB page: off, the pages are 4 KiB
    env = {k: v for k, v in os.environ.items() if k != HUGE_PAGES}
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    cold, steady, big, kept = map(int, out.stdout.split())
    every_page = (sum(SIZES_MIB) << 20) // PAGE
    assert every_page * 0.95 < cold < every_page * 1.05, (cold, every_page)
    assert steady < every_page / 100, (steady, every_page)
    big_pages = (sum(BIG_MIB) << 20) // PAGE
    assert big_pages * 0.95 < big < big_pages * 1.05, (big, big_pages)
    assert kept < big_pages / 100, (kept, big_pages)


def test_a_run_with_heap_keep_faults_in_no_large_gradient_afresh(tmp_path, datasets_dir):
    """Two real runs of tiny with a model of one's own whose first layer's gradient (48 MiB)
    glibc maps afresh every step: by default each step after the first faults its pages
    in again (12,288 of 4 KiB); with ``--heap keep`` the heap keeps it, and the manifest's
    ``training_faults`` say so (10 steps: 138,510 faults against 27,679 kept; 8 steps:
    113,560-113,882 against 27,678-39,405: a heap that fragments grows now and then, a
    gradient's pages at a time)."""
    env = {k: v for k, v in os.environ.items() if k != HUGE_PAGES} | {HUGE_PAGES: "0"}
    faults = {}
    for heap in ("return", "keep"):
        runs = tmp_path / heap
        out = subprocess.run([*python_module("ddlstudy", "run"), "--usecase", "tiny",
                              "--model", f"{OWN}:wide", "--datasets-dir", str(datasets_dir),
                              "--runs-dir", str(runs), "--epochs", "1", "--max-steps",
                              str(STEPS), "--max-val-steps", "1", "--no-snapshot",
                              "--sample-hz", "0", "--quiet", "--heap", heap],
                             capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        m = load_manifest(next(runs.glob("*/manifest.json")))
        assert m["config"]["heap"] == heap
        assert m["host"]["free_page_reporting"] == free_page_reporting()  # this machine's
        faults[heap] = m["backend"]["memory"]["per_rank"][0]["training_faults"]
    gradient = (768 * runpy.run_path(str(OWN))["WIDE"] * 4) // PAGE
    assert faults["return"] - faults["keep"] > (STEPS - 1) * gradient / 2, faults


def _balloon(root: Path, features: str | None, order: str | None) -> Path:
    """A /sys of a VM: a virtio balloon with these feature bits, the kernel's reporting
    order."""
    if features is not None:
        device = root / "bus/virtio/drivers/virtio_balloon/virtio0"
        device.mkdir(parents=True)
        (device / "features").write_text(features + "\n")
    if order is not None:
        params = root / "module/page_reporting/parameters"
        params.mkdir(parents=True)
        (params / "page_reporting_order").write_text(order + "\n")
    return root


def test_a_vm_whose_balloon_reports_free_pages_is_told_from_its_feature_bits(tmp_path):
    """Bit 5 of the balloon's features (VIRTIO_BALLOON_F_REPORTING) says the host takes
    free memory back; a machine without the bit, or without a balloon, is not such a VM."""
    reporting = "0110010100" + "0" * 118  # this development machine's balloon
    assert free_page_reporting(_balloon(tmp_path / "a", reporting, "9")) == {"order": 9}
    assert free_page_reporting(_balloon(tmp_path / "b", reporting, None)) == {"order": -1}
    assert free_page_reporting(_balloon(tmp_path / "c", "0110000100", "9")) is None
    assert free_page_reporting(_balloon(tmp_path / "d", "01", "9")) is None
    assert free_page_reporting(_balloon(tmp_path / "e", None, "9")) is None


def test_advise_says_where_a_model_s_large_weights_vary_its_runs_on_such_a_vm():
    """tiny-full's AlexNet has a weight of 144 MiB, over glibc's 32 MiB: on a VM that
    reports free pages, with the heap returned, the advice and its check say what error
    to expect and name --heap keep; tiny's largest is under 32 MiB, and a kept heap or a
    real machine has no such note."""
    full, tiny = (load_usecase(n) for n in ("tiny-full", "tiny"))
    largest = facts(full.model, len(full.classes)).largest_bytes
    assert largest == 4 * 9216 * 4096  # its first classifier layer (6 x 6 x 256 -> 4096)
    vm = {"order": 9}
    found = refaults(largest, vm, None)
    assert found == {"largest_bytes": largest, "order": 9}
    [note] = refault_note(found)
    assert "144 MiB" in note and "--heap keep" in note and "15 %" in note
    assert f"{REFAULT_PROBE_SECONDS:g} s of steps" in note
    assert probe_box(None, found) == REFAULT_PROBE_SECONDS > PROBE_SECONDS  # a longer box
    assert probe_box(None, None) == PROBE_SECONDS and probe_box(1.5, found) == 1.5
    assert refaults(largest, vm, "keep") is None and refaults(largest, None, None) is None
    assert refault_note(None) == []
    assert refaults(facts(tiny.model, len(tiny.classes)).largest_bytes, vm, None) is None
    checked = {"criterion": "images/s", "rows": [{"measured": 40.0}], "refaults": found,
               "summary": {"rows": 1, "mape": 0.2, "confirmed": None}}
    assert f"(as the advice said: {note})" in summary_lines(checked)
