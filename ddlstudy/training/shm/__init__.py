"""One host's shared memory, for the ranks of a node that all run on this host: it offers
gradients averaged in one shared file (``join``, ``HostMemory``), the ``ddlstudy-shm``
collectives (``new_group``, ``is_shared``), the ``ddlstudy-pipes`` sends between a
pipeline's stages (``register_pipes``, ``PipesOptions``, ``HostPipes``), and FSDP's and
ZeRO's buffers in shared memory (``share_buffers``, ``arena_bytes``, ``share_weights``).

This module is the room's face: the strategies' workers (``training.one_model``, the
pipeline's and sharding's rooms) and ``bench collectives`` import these names from here,
never its parts (an import contract holds it). The parts, from the top: ``fsdp`` and
``zero`` (FSDP's and ZeRO's buffers) over ``collectives`` (the torch.distributed backend)
and ``pipes`` (stages' rings), over ``slots`` (the collectives' algorithms on one file),
over ``file`` (one shared file and a doorbell per rank for a Python process group), over
``average`` (the gradients' average, and the /dev/shm file every part makes with
``reserve``). FSDP's and ZeRO's buffers live here, not in the sharding room, because they
are made of this room's parts (its groups, files, and reductions), and ZeRO's serves
``one_model``'s ZeRO-1 beside sharding's workers.

``fsdp`` and ``zero`` are imported on first use of their names here: they import
torch.distributed.fsdp and .optim (DTensor and sympy with them: 0.6 s), which a pipeline's
ranks, the parent that measures its stages and ``bench collectives`` never need.
"""

from ddlstudy.training.shm.average import GLOO, SHARED, HostMemory, join
from ddlstudy.training.shm.collectives import CollOptions, HostColl, is_shared, new_group
from ddlstudy.training.shm.file import usable
from ddlstudy.training.shm.pipes import BACKEND as PIPES_BACKEND
from ddlstudy.training.shm.pipes import HostPipes, PipesOptions, ring_bytes
from ddlstudy.training.shm.pipes import register as register_pipes

_FSDP = ("Arena", "arena_bytes", "share_buffers")
_ZERO = ("share_weights",)


def __getattr__(name: str):
    """FSDP's and ZeRO's buffers, their modules imported on first use (see above)."""
    if name in _FSDP:
        from ddlstudy.training.shm import fsdp

        return getattr(fsdp, name)
    if name in _ZERO:
        from ddlstudy.training.shm import zero

        return getattr(zero, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GLOO", "PIPES_BACKEND", "SHARED", "CollOptions", "HostColl", "HostMemory",
           "HostPipes", "PipesOptions", "is_shared", "join", "new_group", "register_pipes",
           "ring_bytes", "usable", *_FSDP, *_ZERO]
