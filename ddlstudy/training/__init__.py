"""Training, the same for every strategy and backend. At the top, what every strategy
shares: the loop (``loop``), the batches (``loaders``), one step (``steps``), the epochs
and snapshots (``job``, with the ``Link`` a backend hands a worker), one worker's set-up
(``worker``, its recipe: ``recipe``), flat gradient buffers (``flat``), processes that
train together (``distributed``), and the workers of one model a process (``one_model``)
and of thread replicas (``replicas``). Beside them, a room each (a package whose
``__init__`` is its face): ``pipeline`` (the pipeline's worker: its stages, what they
exchange, their clock), ``sharding`` (FSDP2, ZeRO-1 and tensor parallelism's workers, and
where tensor parallelism splits a model) and ``shm`` (one host's shared memory: the
gradients' average, the ``ddlstudy-shm`` collectives and ``ddlstudy-pipes`` sends, FSDP's
and ZeRO's buffers), which the other two and ``one_model`` reach through its face."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

FACE = ("job", "loaders", "loop", "steps")
"""The modules whose names this face gives (``__all__``), imported on the first use of one
(PEP 562) and not before: a process that trains nothing (MPI's launcher) names the
package without importing torch (2 s of its start)."""


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    for module in (importlib.import_module(f"{__name__}.{m}") for m in FACE):
        if name in vars(module):
            globals()[name] = value = vars(module)[name]
            return value
    raise AttributeError(f"{__name__}.{name} is in none of {FACE}")


if TYPE_CHECKING:
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
