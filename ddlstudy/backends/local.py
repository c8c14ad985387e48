"""The local backend: one node, this machine. A strategy of one process trains in this
one; one of several has them spawned here, in one process group, each its worker."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddlstudy.backends.base import Backend, Environment, register
from ddlstudy.config import RunConfig
from ddlstudy.strategies import get_strategy

if TYPE_CHECKING:
    from ddlstudy.training import Job


@register
class Local(Backend):
    name = "local"
    summary = "one node: this machine, with the strategy's own threads and processes"
    multi_node = False

    def nodes(self, cfg: RunConfig) -> int:
        return 1

    def fit(self, job: Job, env: Environment) -> list[dict]:
        import torch

        from ddlstudy.training import Link
        from ddlstudy.training.distributed import device_of, run_group

        strategy = get_strategy(job.cfg.strategy)
        layout = strategy.layout(job.cfg)
        if layout.processes == 1:
            torch.set_num_threads(layout.torch_threads)
            strategy.worker(job, Link.alone(), device_of(layout.device_type, 0))
        else:
            run_group(strategy.worker, layout.processes, job, layout.threads_per_process,
                      layout.device_type)
        return []
