"""ZeRO-1's weights in this host's shared memory: ``ZeroRedundancyOptimizer``'s buckets
(``parameters_as_bucket_view``: the weights each rank steps, one bucket a rank) become one
shared file of the group's ranks, and every rank's parameters views of it.

Each rank still steps only its own bucket with its own share of the optimizer's state
(ZeRO-1); what changes is the exchange after the step: where every rank broadcast its
bucket to the others (a copy into the slots and one out of them on every rank), the
ranks now meet at a barrier, and every rank reads the buckets the others updated in
place. The bytes are the same. Nobody writes weights between that barrier and the next
step's gradient exchange (forward and backward only read them), and every rank steps only
after the exchange's barriers, once every rank's backward is done; the weights are held
once a host instead of once a process.
"""

from __future__ import annotations

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddlstudy.training.shm import collectives, file
from ddlstudy.training.shm.average import HEADER

ALIGN = 64


def share_weights(optimizer: ZeroRedundancyOptimizer) -> file.Shared | None:
    """The optimizer's buckets (one device's, the CPU's) in a shared file of its group,
    its parameters' data views of them, and its step's broadcasts a barrier; None (the
    broadcasts as before) where the group is not a ``collectives`` group, the buckets are
    not views or the file cannot be made (on every rank alike)."""
    group = optimizer.process_group
    buckets = getattr(optimizer, "_buckets", [])
    if (not collectives.is_shared(group) or not optimizer.parameters_as_bucket_view
            or len(buckets) != 1 or buckets[0][0].device.type != "cpu"):
        return None
    row = buckets[0]
    offsets, total = [], 0
    for bucket in row:
        offsets.append(total)
        total += -(-bucket.numel() * bucket.element_size() // ALIGN) * ALIGN
    shared = group.open_file(HEADER + total, "ddlstudy-zero", "ZeRO's weights")
    if shared is None:
        return None
    views = [torch.frombuffer(shared.mm, dtype=b.dtype, count=b.numel(), offset=HEADER + o)
             for b, o in zip(row, offsets, strict=True)]
    me = group.rank()
    views[me].copy_(row[me])
    group.meet("ZeRO's weights into shared memory")
    _repoint(optimizer, row, views)
    shared_row = buckets[0] = views
    broadcast = optimizer._sync_params

    def sync() -> None:
        if optimizer._buckets[0] is not shared_row:  # rebuilt (trainability changed)
            return broadcast()
        group.meet("ZeRO's weights stepped", "zero step")

    optimizer._sync_params = sync
    return shared


def _repoint(optimizer: ZeroRedundancyOptimizer, row: list[torch.Tensor],
             views: list[torch.Tensor]) -> None:
    """Every parameter whose data lies in one of ``row``'s buckets: the same elements of
    that bucket's view in the file."""
    starts = {b.untyped_storage().data_ptr(): (b, v) for b, v in zip(row, views, strict=True)}
    for group in optimizer.param_groups:
        for param in group["params"]:
            found = starts.get(param.data.untyped_storage().data_ptr())
            if found is None:
                continue
            bucket, view = found
            at = (param.data.data_ptr() - bucket.data_ptr()) // bucket.element_size()
            param.data = view[at:at + param.numel()].view_as(param.data)
