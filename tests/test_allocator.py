"""A training process's allocator starts as it would end once warm: tensors freed and made
again come from the heap, not from pages mapped, faulted in and unmapped each time."""

from __future__ import annotations

import subprocess
import sys

PAGE = 4096
SIZES_MIB = range(1, 25)

CODE = f"""
import resource, sys, torch
from ddlstudy.training import memory

if sys.argv[1] == "steady":
    memory.steady_heap()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for mib in {SIZES_MIB!r}:  # a step's tensors, larger each time, each freed
    t = torch.empty(mib << 18).fill_(1.0)
    del t
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(how: str) -> int:
    """The minor page faults of the blocks in a fresh process (the threshold glibc slides
    up in one is not the next one's)."""
    out = subprocess.run([sys.executable, "-c", CODE, how], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout)


def test_a_steady_heap_does_not_fault_in_each_new_tensor_afresh():
    """Cold, glibc maps each block above its sliding threshold and faults in every page of
    it (1 + 2 + ... + 24 MiB: 76,800 pages, measured 76,807); with ``steady_heap`` the
    heap grows once to the largest and the blocks reuse it (measured 17,391)."""
    cold, steady = _faults("cold"), _faults("steady")
    every_page = (sum(SIZES_MIB) << 20) // PAGE
    assert every_page <= cold < every_page * 1.05, (cold, every_page)
    assert steady < every_page / 3, (steady, every_page)
