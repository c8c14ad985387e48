"""The files an MPI run leaves on this host when it does not end cleanly, and their removal.

MPICH's ranks share a segment in /dev/shm (``mpich_shm_<job hash>_<node>``, 2 MiB for two
ranks, growing with the ranks on the host) that their MPI_Finalize unlinks; hydra's proxy
writes the host's topology for them to /tmp (``hydra_hwloc_xmlfile_XXXXXX``) and unlinks it
as it ends. A rank killed, or a job ended by a signal, leaves both behind, and a host's
/dev/shm fills run after run.

Neither name can be told in advance (the job hash comes from a random key hydra makes;
/tmp is written into hydra, which ignores TMPDIR), and listing the folders before and
after a run would take the files of a run started beside it. So the run's own processes
say which are theirs: while the run lasts, the files of those names that mpiexec's
descendants hold open (every rank holds the segment, the proxy its topology file) are
noted, and once mpiexec has ended those still there are removed.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import psutil

log = logging.getLogger("ddlstudy")

PREFIXES = ("/dev/shm/mpich_", "/tmp/hydra_")
"""MPICH's shared memory (``mpich_shm_*``, ``mpich_vci_*``) and hydra's temporary files."""


def held_open(root: int) -> set[str]:
    """The files named like ``PREFIXES`` that ``root`` and its descendants hold open."""
    try:
        top = psutil.Process(root)
        tree = [top, *top.children(recursive=True)]
    except psutil.Error:
        return set()
    found: set[str] = set()
    for proc in tree:
        try:
            found.update(f.path for f in proc.open_files() if f.path.startswith(PREFIXES))
        except psutil.Error:
            continue
    return found


class Leftovers(threading.Thread):
    """Notes the files mpiexec's processes hold (``held_open``) while it runs; ``remove``
    unlinks them once it has ended. The ranks open them as MPI starts, a few seconds in:
    the first ``QUICK_FOR_S`` are looked at every ``EVERY_S``, the rest of a long run only
    every ``THEN_EVERY_S`` (a run's own host load is measured)."""

    EVERY_S = 0.5
    QUICK_FOR_S = 120.0
    THEN_EVERY_S = 10.0

    def __init__(self, root: int) -> None:
        super().__init__(name="ddlstudy-mpi-leftovers", daemon=True)
        self.root = root
        self.paths: set[str] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while True:
            self.paths |= held_open(self.root)
            quick = time.monotonic() - started < self.QUICK_FOR_S
            if self.stop.wait(self.EVERY_S if quick else self.THEN_EVERY_S):
                return

    def remove(self) -> list[str]:
        """Unlink the noted files that are still there (call it once mpiexec has ended:
        no process of the run uses them then); returns those removed."""
        self.stop.set()
        if self.is_alive():
            self.join()
        removed = []
        for path in sorted(self.paths):
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue  # MPICH or hydra removed it: the run ended cleanly
            except OSError as exc:
                log.warning("could not remove %s, which the MPI run left: %s", path, exc)
                continue
            removed.append(path)
        if removed:
            log.info("removed what the MPI run left: %s", ", ".join(removed))
        return removed
