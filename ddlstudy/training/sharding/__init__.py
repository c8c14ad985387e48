"""Sharding and tensor parallelism, for the strategies that split a model's memory over a
node's processes: it offers their workers (``train_sharded``, ``train_zero``,
``train_tensor``), FSDP2 and tensor parallelism over a mesh of the node's processes
(``mesh_of``, ``shard_model``, ``tensor_parallel``, ``FULL``), the shared-memory arena
sharded would need (``arena_bytes``), and where tensor parallelism splits a model
(``linear_pairs``, ``split_features``, ``pairs_in``).

This module is the room's face: the strategies and advise import these names from here.
Its parts: ``workers`` (the workers and the mesh; this host's shared memory through
``training.shm``'s face) over ``plan`` (where tensor parallelism splits a model). It never
imports the pipeline's room, nor the pipeline's it (an import contract holds both).

``workers`` is imported on first use of its names here: it imports FSDP2, DTensor and
torch's distributed checkpoint, which neither advise's memory check nor a check of a model's
Linear pairs (``plan``: torch.fx alone) needs.
"""

from ddlstudy.training.sharding.plan import linear_pairs, pairs_in, split_features

_WORKERS = ("FULL", "arena_bytes", "full_states", "mesh_of", "shard_model", "tensor_parallel",
            "train_sharded", "train_tensor", "train_zero", "transport_of")


def __getattr__(name: str):
    """The workers' names, their module imported on first use (see above)."""
    if name in _WORKERS:
        from ddlstudy.training.sharding import workers

        return getattr(workers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["linear_pairs", "pairs_in", "split_features", *_WORKERS]
