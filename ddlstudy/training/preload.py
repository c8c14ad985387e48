"""What the warm server a run's processes are forked from imports (``machine.forkserver``),
besides the command line and the runner: torch's compiler front end, which every optimizer
loads (``torch._compile``: about 1 s), and the modules each strategy's worker imports when
it starts; in the server alone (its environment says so), the collector's passes few
while it imports (``machine.collector``), and ``forkserver.serve``: SIGTERM
ignored (the server's end would end the ranks with SIGKILL before their own handlers could
finish a snapshot's write), and an exit without teardown once its parent has ended."""

import os

from ddlstudy.machine import collector, forkserver

if os.environ.get(forkserver.SERVER_ENV):  # no full pass of the collector over its imports
    collector.starting()

import torch._dynamo  # noqa: E402, F401

import ddlstudy.training.distributed  # noqa: E402
import ddlstudy.training.one_model  # noqa: E402
import ddlstudy.training.pipeline  # noqa: E402
import ddlstudy.training.replicas  # noqa: E402

# the parts a room's face imports on the first use of their names (FSDP2, DTensor, ZeRO):
# the workers use them, so the server holds them (an import contract lets this module in)
import ddlstudy.training.sharding.workers  # noqa: E402
import ddlstudy.training.shm.fsdp  # noqa: E402
import ddlstudy.training.shm.zero  # noqa: E402, F401

if os.environ.get(forkserver.SERVER_ENV):
    collector.settled()  # its imports frozen before it forks; each rank counts its own start
    forkserver.serve()
