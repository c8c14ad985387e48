"""hybrid: data-parallel replicas of a pipeline, composed from the pipeline's pieces.

R replicas of an S-stage pipeline (R x S processes, global rank = replica * S + stage);
each replica trains on its slice of every global batch (as a data-parallel worker), and
each stage's gradients are averaged over the replicas that hold it before the optimizer
step (``training.pipeline.exchange.replica_exchange``). Nothing of the training loop is new:
the pipeline's stage worker runs with R > 1.
"""

from __future__ import annotations

from typing import Any

from ddlstudy.config import RunConfig
from ddlstudy.strategies.base import Probe, register
from ddlstudy.strategies.pipeline import Pipeline, chunks, schedule_note


@register
class Hybrid(Pipeline):
    name = "hybrid"
    summary = ("data parallel replicas of a pipeline: --replicas R pipelines of --stages S, "
               "each stage's gradients all-reduced over the replicas; R x S processes")
    flags = ("--replicas R (default 2), --stages S (default 2), --micro-batches M (default "
             "4), --schedule, --stage-starts")
    options = ("stages", "stage_starts", "micro_batches", "schedule", "replicas")

    def replicas(self, cfg: RunConfig) -> int:
        return cfg.replicas

    def stages(self, cfg: RunConfig) -> int:
        if cfg.stages is None and cfg.stage_starts is not None:
            return max(1, len(cfg.stage_starts) // chunks(cfg))
        return cfg.stages or 2

    def label(self, layout: dict[str, Any]) -> str:
        return (f"{self.name} ({layout.get('replicas', '?')} x {layout.get('stages', '?')} "
                f"stages{schedule_note(layout)})")

    def probes(self, cores: int, gpus: int) -> list[Probe]:
        return [Probe("hybrid (2 x 2 stages)",
                      {"strategy": self.name, "replicas": 2, "stages": 2}, 4, replicas=2)]
