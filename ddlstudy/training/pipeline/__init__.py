"""The pipeline's worker, for pipeline and hybrid: it offers a process's stages trained
under a torch.distributed.pipelining schedule (``train_stage``), the model's layers and
where to cut them (``layers_of``, ``cuts``, ``balanced_cuts``) and the schedules
(``SCHEDULES``, ``build_schedule``).

This module is the room's face: the strategies import these names from here. Its parts:
``stages`` (the worker) over ``exchange`` (what stages exchange besides their
micro-batches: replicas' and nodes' gradients, the weights rank 0 validates) and ``clock``
(where a process's steps go). It reaches this host's shared memory through
``training.shm``'s face, and never the sharding room (an import contract holds both).
"""

from ddlstudy.training.pipeline.stages import (
    SCHEDULES,
    balanced_cuts,
    build_schedule,
    cuts,
    layers_of,
    train_stage,
)

__all__ = ["SCHEDULES", "balanced_cuts", "build_schedule", "cuts", "layers_of", "train_stage"]
