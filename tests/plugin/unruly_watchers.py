"""A watcher plugin that misbehaves as ``UNRULY`` says (tests/test_watchers.py installs it
under the entry point group ``ddlstudy.watchers``, as pip would): ``print`` prints in every
hook; ``hang-epoch`` never returns from its first epoch hook, after touching the file
``UNRULY_MARK`` names (so a test knows it is hanging)."""

import os
import threading
from pathlib import Path

from ddlstudy.watchers import Watcher


class Unruly(Watcher):
    name = "unruly"
    summary = "misbehaves as UNRULY says"

    def opened(self, manifest, folder):
        if os.environ.get("UNRULY") == "print":
            print("opened", folder.name)

    def epoch(self, manifest, record):
        if os.environ.get("UNRULY") == "print":
            print("epoch", record["epoch"])
        if os.environ.get("UNRULY") == "hang-epoch":
            Path(os.environ["UNRULY_MARK"]).touch()
            threading.Event().wait()

    def closed(self, manifest):
        if os.environ.get("UNRULY") == "print":
            print("closed", manifest["status"])
        manifest["unruly"] = {"told": "closed"}


UNRULY = Unruly()
