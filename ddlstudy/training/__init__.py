"""Training, the same for every strategy and backend: what the strategies' workers run
(``one_model``: one model a process; ``replicas``: thread replicas; ``stages``: a
pipeline's stages), the loop (``loop``), the batches (``loaders``), one step (``steps``),
the epochs and snapshots (``job``, with the ``Link`` a backend hands a worker), one
worker's set-up (``worker``), flat gradient buffers (``flat``), this host's shared memory
(``hostmem``) and processes that train together (``distributed``)."""

from ddlstudy.training.job import Job, Link, Nodes, train_epochs
from ddlstudy.training.loaders import (
    ResumableBatches,
    ShardedBatches,
    image_dataset,
    make_loaders,
    split_sizes,
    train_loader,
    val_loader,
)
from ddlstudy.training.loop import WARMUP_STEPS, EpochResult, Trainer, evaluate
from ddlstudy.training.steps import (
    Batch,
    StepFn,
    accumulate_grads,
    make_scaler,
    micro_batches,
    optimizer_step,
    plain_step,
    seed_everything,
)

__all__ = ["WARMUP_STEPS", "Batch", "EpochResult", "Job", "Link", "Nodes", "ResumableBatches",
           "ShardedBatches", "StepFn", "Trainer", "accumulate_grads", "evaluate",
           "image_dataset", "make_loaders", "make_scaler", "micro_batches", "optimizer_step",
           "plain_step", "seed_everything", "split_sizes", "train_epochs", "train_loader",
           "val_loader"]
