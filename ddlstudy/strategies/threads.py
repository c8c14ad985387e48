"""cpu-threads: k model replicas in one process, one Python thread each, on n/k of every
batch; the replicas' gradients are summed before replica 0's optimizer step, and the others
take its weights (``training.replicas``). Paper: "each thread works on a replica of the
CNN"."""

from __future__ import annotations

from typing import Any

from ddlstudy.config import RunConfig
from ddlstudy.machine.environment import usable_cores
from ddlstudy.strategies.base import (
    Footprint,
    Layout,
    Probe,
    Strategy,
    register,
    require_batch_per_worker,
)
from ddlstudy.strategies.single import worker_counts


@register
class CpuThreads(Strategy):
    name = "cpu-threads"
    summary = ("one process, k model replicas each trained by its own Python thread on n/k "
               "of every batch, gradients averaged before the step")
    flags = "--workers K (replicas, default: usable cores)"
    options = ("workers",)
    checkpoints = False  # a recomputation resets the random generator its threads share
    grads_in_backward = False  # the replicas' gradients are summed after backward

    def check(self, cfg: RunConfig) -> None:
        require_batch_per_worker(cfg, self.workers(cfg), "replicas")

    def data_parallel(self, cfg: RunConfig) -> int:
        return self.workers(cfg)

    def layout(self, cfg: RunConfig) -> Layout:
        k = self.workers(cfg)
        return Layout(replicas=k, threads_per_process=k,
                      intraop_threads=max(1, usable_cores() // k),
                      loader_workers=cfg.loader_workers)

    def label(self, layout: dict[str, Any]) -> str:
        return f"{self.name} ({layout.get('replicas', '?')} replicas)"

    def footprint(self, cfg: RunConfig) -> Footprint:
        """One process of k replicas, each its weights and gradients; replica 0 alone
        steps (one optimizer state). Each replica's thread holds its share's activations
        in an allocator arena of its own, which no other thread reuses, and a share holds
        more than its share of a batch's activation memory: (k + 1) / 2 batches' worth. An
        own ResNet on tiny's images (6-epoch runs): 1.18-1.22 GiB at its peak, predicted
        0.87 counting one batch (-27 %), 1.40 counting k (+19 %), 1.14 so."""
        k = self.workers(cfg)
        return Footprint(models=k, activations=(k + 1) / 2)

    def probes(self, cores: int, gpus: int) -> list[Probe]:
        return [Probe(f"cpu-threads ({w} replicas)", {"strategy": self.name, "workers": w}, w,
                      replicas=w) for w in worker_counts(cores)]

    def worker(self, job, link, device) -> None:
        from ddlstudy.training.replicas import train_replicas  # torch: in workers only

        train_replicas(job, link, device, self.workers(job.cfg))
