"""One process, one model: the sequential baseline and torch's intra-op threads."""

from __future__ import annotations

from typing import Any

from ddlstudy.config import RunConfig
from ddlstudy.strategies.base import Layout, Probe, Strategy, register


def worker_counts(cores: int) -> list[int]:
    """Threads, replicas or processes worth trying on ``cores``: all, and halves down to 2."""
    out, n = [], cores
    while n >= 2:
        out.append(n)
        n //= 2
    return out


class OneModel(Strategy):
    """A strategy whose every process trains one model on its slice of every batch
    (``training.one_model``)."""

    def worker(self, job, link, device) -> None:
        from ddlstudy.training.one_model import train_one_model  # torch: in workers only

        train_one_model(job, link, device, self.layout(job.cfg).loader_workers)


@register
class Sequential(OneModel):
    name = "sequential"
    summary = ("the baseline: one process, one intra-op thread, data loaded in that process; "
               "every speedup is measured against it")
    resumable = True
    accumulates = True

    def layout(self, cfg: RunConfig) -> Layout:
        # By definition the baseline decodes its own data: no loader workers.
        return Layout(loader_workers=0)

    def probes(self, cores: int, gpus: int) -> list[Probe]:
        return [Probe("sequential", {"strategy": "sequential"}, 1)]


@register
class CpuIntraOp(OneModel):
    name = "cpu-intraop"
    summary = ("one process, one model, torch's intra-op threads over all cores (the paper's "
               "CPU single-process)")
    flags = "--workers N (threads, default: all usable cores), --loader-workers"
    options = ("workers",)
    resumable = True
    accumulates = True

    def layout(self, cfg: RunConfig) -> Layout:
        return Layout(threads_per_process=self.workers(cfg), loader_workers=cfg.loader_workers)

    def label(self, layout: dict[str, Any]) -> str:
        return f"{self.name} ({layout.get('threads_per_process', '?')} threads)"

    def probes(self, cores: int, gpus: int) -> list[Probe]:
        return [Probe(f"cpu-intraop ({w} threads)", {"strategy": self.name, "workers": w}, w)
                for w in worker_counts(cores)]
