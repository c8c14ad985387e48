"""cpu-processes and gpu-data: k processes, one replica each, gradients averaged every step
(the paper's fastest CPU strategy, and its GPU twin).

Every rank walks the same shuffled sequence of global batches (one seeded generator, as in
the sequential baseline) and loads only its slice of each, so the k slices together are
exactly the baseline's batch. On one host (``--transport auto``) each rank's gradients are
views of its slot in one shared-memory file and the ranks average the slots after
backward; otherwise DistributedDataParallel over gloo (NCCL for gpu-data) all-reduces them
in buckets while the backward pass runs (``training.one_model``). Threads per process are
cores // k, so k x threads never oversubscribes the machine. Rank 0 validates together
with the others (each a slice, counts summed) and writes the run folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ddlstudy.config import RunConfig
from ddlstudy.errors import NotHere
from ddlstudy.machine import forkserver
from ddlstudy.machine.environment import under_launcher, usable_cores
from ddlstudy.strategies.base import (
    REGISTRY,
    Layout,
    Probe,
    register,
    require_batch_per_worker,
    warn_if_oversubscribed,
)
from ddlstudy.strategies.single import OneModel, worker_counts


@register
class CpuProcesses(OneModel):
    name = "cpu-processes"
    summary = ("k processes, each a replica with its slice of every batch, gradients "
               "averaged every step through this host's shared memory (else DDP over "
               "gloo); the paper's fastest CPU strategy")
    flags = "--workers K (processes, default: usable cores), --loader-workers, --transport"
    options = ("workers",)
    resumable = True
    accumulates = True

    def check(self, cfg: RunConfig) -> None:
        k = self.workers(cfg)
        require_batch_per_worker(cfg, k, "processes")
        warn_if_oversubscribed(k)

    def data_parallel(self, cfg: RunConfig) -> int:
        return self.workers(cfg)

    def layout(self, cfg: RunConfig) -> Layout:
        k = self.workers(cfg)
        return Layout(processes=k, threads_per_process=max(1, usable_cores() // k),
                      loader_workers=cfg.loader_workers, collectives="gloo")

    def label(self, layout: dict[str, Any]) -> str:
        return f"{self.name} ({layout.get('processes', '?')} processes)"

    def probes(self, cores: int, gpus: int) -> list[Probe]:
        return [Probe(f"cpu-processes ({w} processes)", {"strategy": self.name, "workers": w},
                      w, replicas=w) for w in worker_counts(cores)]


GPU_DEVICE_FILES = ("nvidia[0-9]*", "kfd", "dxg")
"""The device files through which torch's CUDA (or ROCm's HIP, or WSL's) reaches a GPU:
without any, it sees none."""


def warm_early(cfg: RunConfig) -> None:
    """Where this process will start its node's processes (a local run of several, or an
    MPI rank leading several), start the server they are forked from now, before this
    process's own imports: on another core, it imports torch and ddlstudy beside them
    (``machine.forkserver``), and torchvision where the model comes from it."""
    if cfg.backend != "local" and not (cfg.backend == "mpi" and under_launcher()):
        return
    try:
        several = REGISTRY.named(cfg.strategy)().layout(cfg).processes > 1
    except Exception:  # noqa: BLE001 - refused, with its reason, by the run's checks
        return
    spec = cfg.usecase.model
    if several:
        # the paper's networks are built without torchvision (models.paper)
        forkserver.warm(*(["torchvision"] if spec.kind == "torchvision" else []))


def cuda_devices() -> int:
    """The CUDA GPUs torch sees (imports torch: a check, not a listing), none without
    importing it where the machine has no GPU device (the layouts of a command's first
    second need it, before torch is imported: ``warm_early``)."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES", "any").strip() in ("", "-1")
    if hidden or not any(next(Path("/dev").glob(p), None) for p in GPU_DEVICE_FILES):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_each(processes: int) -> str:
    """Where a node of ``processes`` trains when it may take GPUs (pipeline, hybrid,
    sharded, zero, tensor): cuda where there is one for each process, else cpu."""
    return "cuda" if cuda_devices() >= processes else "cpu"


@register
class GpuData(OneModel):
    name = "gpu-data"
    summary = ("one process per GPU, DistributedDataParallel over NCCL, CPU loader workers "
               "decoding ahead so each GPU stays busy")
    flags = "--devices N (GPUs, default: all), --loader-workers (default: cores per GPU - 1)"
    options = ("devices",)
    resumable = True
    accumulates = True

    def devices(self, cfg: RunConfig) -> int:
        return cfg.devices or cuda_devices()

    def data_parallel(self, cfg: RunConfig) -> int:
        return max(1, self.devices(cfg))

    def check(self, cfg: RunConfig) -> None:
        if not cuda_devices():
            raise NotHere("--strategy", "gpu-data needs CUDA GPUs and this machine has none "
                              "(torch.cuda.is_available() is False); use cpu-processes for "
                              "data parallelism on CPU")
        if self.devices(cfg) > cuda_devices():
            raise NotHere("--devices", f"{self.devices(cfg)} GPUs asked for but only "
                              f"{cuda_devices()} are visible")
        require_batch_per_worker(cfg, self.devices(cfg), "GPUs")

    def loader_workers(self, cfg: RunConfig) -> int:
        return cfg.loader_workers or max(1, usable_cores() // self.devices(cfg) - 1)

    def layout(self, cfg: RunConfig) -> Layout:
        k = self.devices(cfg)
        return Layout(processes=k, devices=k, loader_workers=self.loader_workers(cfg),
                      collectives="nccl", device="cuda")

    def label(self, layout: dict[str, Any]) -> str:
        return f"{self.name} ({layout.get('devices') or 'all'} GPUs)"

    def probes(self, cores: int, gpus: int) -> list[Probe]:
        n = max(gpus, 1)
        return [Probe(f"gpu-data ({gpus or 'all'} GPUs)", {"strategy": self.name}, n,
                      replicas=n, gpus=True)]
