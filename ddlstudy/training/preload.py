"""What the warm server a run's processes are forked from imports (``machine.forkserver``),
besides the command line and the runner: torch's compiler front end, which every optimizer
loads (``torch._compile``: about 1 s), and the modules each strategy's worker imports when
it starts. In the server alone (its environment says so), SIGTERM is ignored: a signal to
the whole process group must not end the server, whose end ends the ranks with SIGKILL
before their own handlers could finish a snapshot's write."""

import os
import signal

import torch._dynamo  # noqa: F401

import ddlstudy.training.distributed
import ddlstudy.training.one_model
import ddlstudy.training.replicas
import ddlstudy.training.sharding
import ddlstudy.training.stages  # noqa: F401
from ddlstudy.machine.forkserver import SERVER_ENV

if os.environ.get(SERVER_ENV):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
