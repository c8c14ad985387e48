"""Before a run starts: everything a user can get wrong refused (``preflight``), before
the run folder exists, so that a refused run leaves nothing behind; and the run's
effective parallelism, once (``resolve``)."""

from __future__ import annotations

import dataclasses
import logging
from importlib import metadata

from ddlstudy import models
from ddlstudy.backends import REGISTRY as BACKENDS
from ddlstudy.backends import get_backend
from ddlstudy.config import Effective, RunConfig, checked
from ddlstudy.config.folders import usecase_key
from ddlstudy.data import planned_steps
from ddlstudy.errors import ConfigError, Unavailable
from ddlstudy.models.sources import named
from ddlstudy.strategies import REGISTRY, get_strategy

log = logging.getLogger("ddlstudy")


def _recipe_checked(train, lr: float | None, device: str, steps: int) -> None:
    """``recipe.check``, once for each [train] table, learning rate, device, run length
    and torch version on this machine (``config.checked``): it makes the optimizer, whose
    first making imports torch's compiler front end (1 s) in a process that may train
    nothing (the parent of a run's processes, MPI's launcher)."""
    key = [dataclasses.asdict(train), lr, device, steps, metadata.version("torch")]
    if not checked.recalled("recipes", key):
        from ddlstudy.training import recipe  # torch, only where no record says

        recipe.check(train, lr, device, steps)
        checked.keep("recipes", key, passed=True)


def resolve(cfg: RunConfig) -> RunConfig:
    """``cfg`` with its effective parallelism: the strategy's data-parallel workers on a
    node times the backend's nodes, and the global batch and learning rate they give."""
    if cfg.effective is not None:
        return cfg
    workers = get_strategy(cfg.strategy).data_parallel(cfg) * \
        get_backend(cfg.backend).nodes(cfg)
    return dataclasses.replace(cfg, effective=Effective.of(cfg, workers))


def preflight(cfg: RunConfig, resuming: bool = False) -> RunConfig:
    """Refuse what cannot run before anything starts: ConfigError for a bad combination,
    Unavailable for one this machine or this version cannot run (no GPU, no mpiexec).
    Returns ``cfg`` resolved (its effective parallelism computed, once)."""
    strategy, backend = get_strategy(cfg.strategy), get_backend(cfg.backend)
    uc = cfg.usecase
    with named("--model" if cfg.model is not None else usecase_key(uc, "model.arch")):
        models.check(uc.model, len(uc.classes), uc.train.image_size, cfg.checkpoint_activations)
        if cfg.init_weights is not None:
            from ddlstudy.models.trained import check_weights  # torch

            check_weights(uc.model, len(uc.classes), cfg.init_weights)
    if (cfg.nodes or 1) > 1 and not backend.multi_node:
        several = [name for name, cls in BACKENDS.loaded().items() if cls.multi_node]
        raise ConfigError("--nodes", f"more than one node needs --backend "
                          f"{' or '.join(several)}")
    cfg = resolve(cfg)
    strategy.check_options(cfg)
    strategy.check(cfg)
    _recipe_checked(uc.train, cfg.lr, strategy.layout(cfg).device_type,
                    planned_steps(cfg))
    exact = [name for name, cls in REGISTRY.loaded().items() if cls.resumable]
    if (resuming or cfg.snapshot_every) and not strategy.resumable:
        flag = "--resume" if resuming else "--snapshot-every"
        raise Unavailable(flag, f"{strategy.name} cannot yet be resumed exactly (only its "
                          f"epoch-end snapshots are written); strategies that can: "
                          f"{', '.join(exact)}")
    # --accumulate and fp16's gradient scaler live in the step every accumulating
    # strategy shares (training.accumulate_grads and optimizer_step).
    can = [name for name, cls in REGISTRY.loaded().items() if cls.accumulates]
    if cfg.precision == "fp16":
        if not strategy.accumulates:
            raise Unavailable("--precision", f"{strategy.name} has no fp16 gradient scaler "
                              f"yet; use bf16, or one of: {', '.join(can)}")
        if resuming or cfg.snapshot_every:
            raise Unavailable("--resume" if resuming else "--snapshot-every",
                              "fp16 runs cannot be resumed exactly yet (the snapshot does "
                              "not hold the gradient scaler's state)")
        if strategy.layout(cfg).collectives != "nccl":
            log.warning("fp16 on the CPU runs through slow kernels (simple-big sequential "
                        "measured 1.2 images/s against 37 in fp32 on an AVX-512 CPU); it "
                        "is meant for GPUs: on CPUs use --precision bf16")
    if cfg.accumulate > 1:
        if not strategy.accumulates:
            raise Unavailable("--accumulate", f"{strategy.name} does not accumulate "
                              f"gradients yet; strategies that do: {', '.join(can)}")
        share = cfg.global_batch // cfg.data_parallel()
        if cfg.accumulate > share:
            raise ConfigError("--accumulate", f"{cfg.accumulate} micro-batches but each "
                              f"worker gets only {share} image(s) of every batch")
    backend.check(cfg, strategy, resuming)
    return cfg
