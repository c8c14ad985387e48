"""hybrid: data-parallel replicas of a pipeline, composed from the pipeline's pieces.

R replicas of an S-stage pipeline (R x S processes, global rank = replica * S + stage);
each replica trains on its slice of every global batch (as a data-parallel worker), and
each stage's gradients are averaged over the replicas that hold it before the optimizer
step (``pipeline.replica_exchange``). Nothing of the training loop is new: the pipeline's
stage worker runs with R > 1.
"""

from __future__ import annotations

from ddlstudy.config import RunConfig
from ddlstudy.strategies.base import register
from ddlstudy.strategies.pipeline import Pipeline


@register
class Hybrid(Pipeline):
    name = "hybrid"
    options = ("stages", "stage_starts", "micro_batches", "replicas")

    def replicas(self, cfg: RunConfig) -> int:
        return cfg.replicas

    def stages(self, cfg: RunConfig) -> int:
        return cfg.stages or 2
