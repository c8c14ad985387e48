"""The local backend: one node, this machine; the strategy starts whatever processes it
needs itself."""

from __future__ import annotations

from ddlstudy.backends.base import Backend, Environment, register
from ddlstudy.config import RunConfig
from ddlstudy.strategies import get_strategy
from ddlstudy.training import Job


@register
class Local(Backend):
    name = "local"
    summary = "one node: this machine, with the strategy's own threads and processes"

    def nodes(self, cfg: RunConfig) -> int:
        return 1

    def fit(self, job: Job, env: Environment) -> list[dict]:
        get_strategy(job.cfg.strategy).fit(job)
        return []
