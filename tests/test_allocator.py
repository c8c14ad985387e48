"""A training process's allocator starts as it would end once warm: tensors freed and made
again come from the heap, not from pages mapped, faulted in and unmapped each time."""

from __future__ import annotations

import os
import subprocess
import sys

from ddlstudy.machine.environment import HUGE_PAGES

PAGE = 4096
SIZES_MIB = range(1, 25)

CODE = f"""
import resource, torch
from ddlstudy.training import memory

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for mib in {SIZES_MIB!r}:  # a step's tensors, larger each time, each freed
        t = torch.empty(mib << 18).fill_(1.0)
        del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

# glibc's threshold as a cold process starts with it (128 KiB), held there: where a
# process's start left its sliding threshold varies (compiling the .pyc files of a fresh
# clone raised it past these blocks)
memory._LIBC.mallopt(memory.M_MMAP_THRESHOLD, 128 << 10)
cold = faults()
memory.steady_heap()
print(cold, faults())
"""


def test_a_steady_heap_does_not_fault_in_each_new_tensor_afresh():
    """At a cold glibc's threshold, each block is mapped and every page of it faulted in
    (1 + 2 + ... + 24 MiB: 76,800 pages; measured 76,628-76,824); after ``steady_heap``
    the heap grows to the largest and the blocks reuse it (17,391 in a process of its
    own)."""
    # torch's huge pages (a run's command turns them on: environment.use_huge_pages, as a
    # test before this one may have) count a fault a 2 MiB page: off, the pages are 4 KiB
    env = {k: v for k, v in os.environ.items() if k != HUGE_PAGES}
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    cold, steady = map(int, out.stdout.split())
    every_page = (sum(SIZES_MIB) << 20) // PAGE
    assert every_page * 0.95 < cold < every_page * 1.05, (cold, every_page)
    assert steady < every_page / 3, (steady, every_page)
