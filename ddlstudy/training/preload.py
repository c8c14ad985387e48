"""What the warm server a run's processes are forked from imports (``machine.forkserver``),
besides the command line and the runner: torch's compiler front end, which every optimizer
loads (``torch._compile``: about 1 s), and the modules each strategy's worker imports when
it starts; in the server alone (its environment says so), ``forkserver.serve``: SIGTERM
ignored (the server's end would end the ranks with SIGKILL before their own handlers could
finish a snapshot's write), and an exit without teardown once its parent has ended."""

import os

import torch._dynamo  # noqa: F401

import ddlstudy.training.distributed
import ddlstudy.training.one_model
import ddlstudy.training.pipeline
import ddlstudy.training.replicas

# the parts a room's face imports on the first use of their names (FSDP2, DTensor, ZeRO):
# the workers use them, so the server holds them (an import contract lets this module in)
import ddlstudy.training.sharding.workers
import ddlstudy.training.shm.fsdp
import ddlstudy.training.shm.zero  # noqa: F401
from ddlstudy.machine import forkserver

if os.environ.get(forkserver.SERVER_ENV):
    forkserver.serve()
