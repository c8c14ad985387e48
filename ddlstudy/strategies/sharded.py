"""sharded, zero and tensor: the node's k processes split the model's memory between them
instead of each holding all of it.

- ``sharded``: FSDP2 (``torch.distributed.fsdp.fully_shard``), ZeRO-3: parameters,
  gradients and optimizer state each cut into k shards; a block's parameters are
  all-gathered for its forward and backward, its gradients reduce-scattered after. With
  ``--no-reshard-after-forward`` the gathered parameters stay between forward and backward
  (ZeRO-2's memory, one all-gather a step fewer). ``--tensor T``: a 2-D mesh, tensor
  parallel inside each group of T processes, FSDP2 over the k / T groups (torchtitan's
  order).
- ``zero``: ZeRO-1, cpu-processes with its optimizer state sharded
  (``ZeroRedundancyOptimizer``): gradients averaged as cpu-processes does, each process
  steps its share of the weights and hands them to the others.
- ``tensor``: tensor parallelism over DTensor: consecutive Linear layers split into a
  column-parallel and a row-parallel half, the rest replicated. Its k processes share one
  batch (each computes all of it on its half of those layers), so its images/s is per
  image of the global batch like every other strategy's.

Every data-parallel shard takes its slice of every global batch as cpu-processes' ranks
do, so ``sharded`` and ``zero`` take cpu-processes' steps; ``tensor`` takes the
sequential baseline's.
"""

from __future__ import annotations

import math
from typing import Any

from ddlstudy.config import RunConfig
from ddlstudy.errors import ConfigError, Unavailable
from ddlstudy.machine.environment import usable_cores
from ddlstudy.strategies.base import (
    Footprint,
    Layout,
    Probe,
    register,
    require_batch_per_worker,
    warn_if_oversubscribed,
)
from ddlstudy.strategies.processes import CpuProcesses, gpu_each
from ddlstudy.strategies.single import worker_counts


class _Sharding(CpuProcesses):
    """k processes on one node, one process group; what each holds is the subclass's."""

    table = 1

    def device_type(self, cfg: RunConfig) -> str:
        """Its processes on GPUs (NCCL) when there is one for each, else on CPU (gloo, or
        this host's shared memory), from the same code."""
        if cfg.backend == "spark":  # Spark's tasks train on the CPU
            return "cpu"
        return gpu_each(self.workers(cfg))

    def layout(self, cfg: RunConfig) -> Layout:
        k = self.workers(cfg)
        cuda = self.device_type(cfg) == "cuda"
        return Layout(processes=k, threads_per_process=1 if cuda else max(1, usable_cores() // k),
                      loader_workers=cfg.loader_workers, collectives="nccl" if cuda else "gloo",
                      device="cuda" if cuda else None, tensor=self.tensor_degree(cfg))

    trains: str
    """Its worker: the function of ``training.sharding`` that trains one of its processes."""
    whole_replicas = False
    """Whether each process holds a whole replica of the weights (advise's memory check)."""

    def tensor_degree(self, cfg: RunConfig) -> int | None:
        return None

    def probes(self, cores: int, gpus: int) -> list[Probe]:
        """k processes for each of ``worker_counts``, and one a GPU where there are 2 or
        more: a layout of no more processes than GPUs trains on them (``gpu_each``), and
        says so in its label."""
        counts = sorted({*worker_counts(cores), *([gpus] if gpus >= 2 else [])}, reverse=True)
        return [Probe(f"{self.name} ({w} processes{', a GPU each' if w <= gpus else ''})",
                      {"strategy": self.name, "workers": w}, w,
                      replicas=w if self.whole_replicas else 1, gpus=w <= gpus)
                for w in counts] + self.more_probes(counts, gpus)

    def more_probes(self, counts: list[int], gpus: int) -> list[Probe]:
        """Other layouts of it worth ranking (none but sharded's)."""
        return []

    def worker(self, job, link, device) -> None:
        from ddlstudy.training import sharding  # torch: in workers only

        getattr(sharding, self.trains)(job, link, device, self.layout(job.cfg).loader_workers)

    def check(self, cfg: RunConfig) -> None:
        if cfg.backend == "spark":
            _check_spark(self.name, cfg, self.workers(cfg))
        if cfg.precision == "fp16":
            raise ConfigError("--precision", f"{self.name} has no fp16 gradient scaler yet: "
                              f"use bf16")

    def label(self, layout: dict[str, Any]) -> str:
        return f"{self.name} ({layout.get('processes', '?')} processes)"


@register
class Sharded(_Sharding):
    name = "sharded"
    shards = "parameters, gradients and optimizer state (FSDP2, ZeRO-3)"
    summary = ("k processes, each holding 1/k of the parameters, gradients and optimizer "
               "state (FSDP2's fully_shard per block, ZeRO-3; --no-reshard-after-forward: "
               "ZeRO-2), each a slice of every batch; --tensor T: tensor parallel inside")
    flags = ("--workers K (processes, default: usable cores), --no-reshard-after-forward, "
             "--no-shared-buffers, --tensor T (a 2-D mesh: tensor parallel over T of the K "
             "processes)")
    options = ("workers", "reshard_after_forward", "shared_buffers", "tensor")
    accumulates = True
    trains = "train_sharded"

    def tensor_degree(self, cfg: RunConfig) -> int | None:
        return cfg.tensor

    def check(self, cfg: RunConfig) -> None:
        _Sharding.check(self, cfg)
        k = self.workers(cfg)
        t = cfg.tensor or 1
        if k % t:
            raise ConfigError("--tensor", f"{t} does not divide the {k} processes "
                              f"(--workers): the mesh is {k} / T data-parallel groups of T")
        if t == k > 1:
            raise ConfigError("--tensor", f"{t} of the {k} processes leaves none to shard "
                              f"over (the mesh would be 1 x {t}): that is --strategy tensor "
                              f"--workers {k}; or give --workers a multiple of {t} above it")
        if t > 1:
            _check_tensor_pairs(cfg, t, "--tensor")
        require_batch_per_worker(cfg, k // t, "data-parallel shards")
        if self.device_type(cfg) == "cpu":
            warn_if_oversubscribed(k)

    def data_parallel(self, cfg: RunConfig) -> int:
        return self.workers(cfg) // (cfg.tensor or 1)

    def more_probes(self, counts: list[int], gpus: int) -> list[Probe]:
        """Its largest layout with FSDP's own buffers (the memory they save against the
        speed the shared ones buy), and a 2-D mesh of 4 processes (2 x 2: tensor parallel
        inside each pair), named as too large where the machine has fewer cores."""
        if not counts:
            return []
        w = counts[0]
        return [Probe(f"{self.name} ({w} processes, own buffers)",
                      {"strategy": self.name, "workers": w, "no_shared_buffers": True}, w,
                      gpus=w <= gpus),
                Probe(f"{self.name} (4 processes, tensor 2)",
                      {"strategy": self.name, "workers": 4, "tensor": 2}, 4, gpus=gpus >= 4)]

    def footprint(self, cfg: RunConfig) -> Footprint:
        """Parameters, gradients and optimizer state cut in k shards: one copy over the
        node (with --no-reshard-after-forward each process keeps the gathered
        parameters, half a model, from forward to backward)."""
        k = self.workers(cfg)
        return Footprint(k, 1.0 if cfg.reshard_after_forward else 1 + k / 2,
                         shared_bytes=self.arena(cfg), gathers=(1.0, 1.0))

    def arena(self, cfg: RunConfig) -> int:
        """The bytes of the arena in shared memory its processes gather and reduce
        through (``--no-shared-buffers``, a 2-D mesh, --transport gloo or GPUs: none)."""
        k = self.workers(cfg)
        if (not cfg.shared_buffers or (cfg.tensor or 1) > 1 or k < 2
                or cfg.transport != "auto" or self.device_type(cfg) != "cpu"):
            return 0
        from ddlstudy.models import shapes_only  # torch: only when asked
        from ddlstudy.training.sharding import arena_bytes

        model, _ = shapes_only(cfg.usecase.model, len(cfg.usecase.classes))
        return arena_bytes(model, k)

    def label(self, layout: dict[str, Any]) -> str:
        tensor = layout.get("tensor")
        inside = f", tensor {tensor}" if tensor else ""
        return f"{self.name} ({layout.get('processes', '?')} processes{inside})"



@register
class Zero(_Sharding):
    name = "zero"
    shards = "optimizer state (ZeRO-1, ZeroRedundancyOptimizer)"
    summary = ("cpu-processes with the optimizer state split over its k processes (ZeRO-1, "
               "torch's ZeroRedundancyOptimizer): each steps 1/k of the weights")
    flags = ("--workers K (processes, default: usable cores), --loader-workers, --transport, "
             "--no-shared-buffers")
    options = ("workers", "shared_buffers")
    accumulates = True
    trains = "train_zero"
    whole_replicas = True

    def footprint(self, cfg: RunConfig) -> Footprint:
        """A whole replica in each process, the optimizer state cut in k shards (whole on
        rank 0 as it writes a snapshot: the other ranks' k - 1 shards beside its own)."""
        k = self.workers(cfg)
        return Footprint(k, k, 1.0, gathers=(0.0, (k - 1) / k))

    def check(self, cfg: RunConfig) -> None:
        _Sharding.check(self, cfg)
        CpuProcesses.check(self, cfg)



@register
class Tensor(_Sharding):
    name = "tensor"
    shards = "the Linear layers' weights (tensor parallel, DTensor)"
    summary = ("k processes share each batch, every pair of consecutive Linear layers split "
               "column- then row-wise over them (DTensor's tensor parallelism), the rest "
               "replicated")
    flags = "--workers K (processes, default: usable cores), --loader-workers"
    table = 2
    accumulates = True
    trains = "train_tensor"

    def check(self, cfg: RunConfig) -> None:
        if cfg.backend == "spark":
            raise Unavailable("--backend", "Spark's tasks would be one tensor-parallel group "
                              "sharing each batch, where a run's nodes are its data-parallel "
                              "workers; use --backend mpi (each node one tensor-parallel "
                              "group), or sharded or zero across Spark's tasks")
        _Sharding.check(self, cfg)
        _check_tensor_pairs(cfg, self.workers(cfg), "--workers")
        if self.device_type(cfg) == "cpu":
            warn_if_oversubscribed(self.workers(cfg))

    def data_parallel(self, cfg: RunConfig) -> int:
        return 1

    def footprint(self, cfg: RunConfig) -> Footprint:
        """k processes, each the model but its half of each Linear pair, each computing
        the whole batch (rank 0 the whole model and optimizer state as it writes a
        snapshot)."""
        k = self.workers(cfg)
        return Footprint(k, k, k, k, tensor=k, gathers=(1.0, 1.0))

    def tensor_degree(self, cfg: RunConfig) -> int | None:
        return self.workers(cfg)

    def label(self, layout: dict[str, Any]) -> str:
        return f"{self.name} ({layout.get('processes', '?')} processes, one batch)"



def _check_spark(name: str, cfg: RunConfig, workers: int) -> None:
    """Spark holds these where a task can: one process a task (``--workers 1``), the
    tasks' gloo group (``--spark-sync gloo``) the processes the model is split over."""
    if cfg.spark_sync != "gloo":
        raise Unavailable("--spark-sync", f"{cfg.spark_sync} averages whole weights between "
                          f"the tasks, and {name} splits them over its processes; use "
                          f"--spark-sync gloo, whose tasks form one process group")
    if workers != 1:
        raise Unavailable("--workers", f"a Spark barrier task is one process, and {name} "
                          f"--workers {workers} asks for {workers} a node; give --workers 1 "
                          f"(the model split over the tasks, one process each) or use "
                          f"--backend mpi, whose ranks lead nodes of several processes")


def _check_tensor_pairs(cfg: RunConfig, degree: int, flag: str) -> None:
    """Refuse a model with no pair of consecutive Linear layers to split (tensor parallel
    needs one), or one whose pairs ``degree`` processes cannot split evenly, before
    anything starts."""
    from ddlstudy.training.sharding import split_features  # torch: only when asked

    uc = cfg.usecase
    split = split_features(uc.model, len(uc.classes))
    if not split:
        raise ConfigError("--strategy", f"tensor parallelism splits pairs of consecutive "
                          f"Linear layers (only activations or dropout between them) and "
                          f"{uc.model.arch} has none; use sharded or zero to split its "
                          f"memory instead")
    uneven = [(name, n) for name, n in split if n % degree]
    if uneven:
        name, n = uneven[0]
        common = math.gcd(*(n for _, n in split))
        fit = [str(d) for d in range(2, min(common, 64) + 1) if common % d == 0][:6]
        said = f"{', '.join(fit[:-1])} or {fit[-1]}" if len(fit) > 1 else \
            fit[0] if fit else "1: its pairs share no divisor"
        raise ConfigError(flag, f"{degree} processes cannot split {name}'s {n} features "
                          f"evenly (tensor parallelism cuts each Linear pair's features "
                          f"among them); give {flag} {said}")
