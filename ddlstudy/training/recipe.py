"""The recipe a use case declares, made with torch: its optimizer (``[train] optimizer`` and
``optimizer_args``: the paper's SGD with ``train.momentum`` by default) and its learning
rate's schedule (``lr_schedule`` and ``lr_schedule_args``, after the linear warm-up of
``lr_warmup_epochs``, stepped per optimizer step), every name and argument checked against
torch's own classes before anything starts (``check``, from preflight)."""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim import lr_scheduler

from ddlstudy.config import TrainSpec
from ddlstudy.config.recipe import SGD
from ddlstudy.errors import ConfigError

Scheduler = lr_scheduler.LRScheduler

UNSTEPPABLE = {
    "LBFGS": "steps with a closure that evaluates the model again, which a training step "
             "does not give",
    "SparseAdam": "takes sparse gradients only",
    "Muon": "steps 2-D weights only, and every model has biases",
    "ReduceLROnPlateau": "steps on a validation metric, not per optimizer step",
    "SequentialLR": "chains schedules a table cannot hold",
    "ChainedScheduler": "chains schedules a table cannot hold",
    "LambdaLR": "takes a function a table cannot hold",
    "MultiplicativeLR": "takes a function a table cannot hold",
}
"""torch's classes a use case cannot name, and why."""
SHORT = {"step": "StepLR", "cosine": "CosineAnnealingLR", "onecycle": "OneCycleLR"}
"""``lr_schedule``'s short names, and torch's schedule each is."""


def _classes(module: Any, base: type) -> dict[str, type]:
    return {name: cls for name, cls in vars(module).items()
            if isinstance(cls, type) and issubclass(cls, base) and cls is not base
            and not name.startswith("_") and name not in ("LRScheduler",)}


def _find(kind: str, key: str, name: str, known: dict[str, type],
          short: tuple[str, ...] = ()) -> type:
    """The class ``name`` of ``known``, or a refusal naming ``key`` and the nearest (of
    ``short`` names too)."""
    if name in UNSTEPPABLE:
        raise ConfigError(key, f"{name} {UNSTEPPABLE[name]}; choose another {kind}")
    if name not in known:
        usable = [*short, *sorted(n for n in known if n not in UNSTEPPABLE)]
        near = [n for n in usable if n.lower() == name.lower()] or \
            difflib.get_close_matches(name, usable, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(near)}? " if near else ""
        raise ConfigError(key, f"unknown {kind} {name!r}; {hint}choose one of: "
                          f"{', '.join(usable)}")
    return known[name]


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """torch.optim's optimizer ``name`` (``train.optimizer``)."""
    return _find("optimizer", "train.optimizer", name, _classes(torch.optim,
                                                                 torch.optim.Optimizer))


def optimizer_args(train: TrainSpec, lr: float) -> dict[str, Any]:
    """The optimizer's keyword arguments: the run's learning rate, SGD's momentum, and the
    use case's ``optimizer_args``."""
    momentum = {"momentum": train.momentum} if train.optimizer == SGD else {}
    return {"lr": lr, **momentum, **(train.optimizer_args or {})}


def optimizer(params: Iterable[torch.nn.Parameter], train: TrainSpec, lr: float,
              zero: bool = False, group=None) -> torch.optim.Optimizer:
    """The use case's optimizer of ``params`` at ``lr``; with ``zero``, torch's
    ZeroRedundancyOptimizer over it (its state sharded over ``group``, default: the
    default process group)."""
    cls, args = optimizer_class(train.optimizer), optimizer_args(train, lr)
    if zero:  # torch.distributed.optim loads FSDP, DTensor and sympy: only where it is used
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, cls, process_group=group,
                                       parameters_as_bucket_view=True, **args)
    return cls(params, **args)


def states_per_weight(train: TrainSpec) -> int:
    """The tensors the size of a weight the optimizer keeps for each (SGD with momentum:
    1, Adam: 2), counted on one weight after one step."""
    weight = torch.nn.Parameter(torch.zeros(4, 4))
    made = optimizer([weight], train, train.lr)
    weight.grad = torch.ones_like(weight)
    made.step()
    return sum(1 for v in made.state[weight].values()
               if isinstance(v, torch.Tensor) and v.shape == weight.shape)


def schedule_class(name: str) -> type[Scheduler]:
    """The schedule ``lr_schedule`` names: a short name or torch's class."""
    return _find("learning-rate schedule", "train.lr_schedule", SHORT.get(name, name),
                 _classes(lr_scheduler, Scheduler), ("none", *SHORT))


def _schedule_args(train: TrainSpec, lr: float, steps: int) -> dict[str, Any]:
    """The schedule's arguments: its defaults over ``steps`` (the run's optimizer steps
    after the warm-up), then the use case's."""
    steps = max(1, steps)
    defaults = {"StepLR": {"step_size": max(1, steps // 3)},
                "CosineAnnealingLR": {"T_max": steps},
                "OneCycleLR": {"max_lr": lr, "total_steps": steps}}
    name = SHORT.get(train.lr_schedule, train.lr_schedule)
    return defaults.get(name, {}) | (train.lr_schedule_args or {})


def warmup_steps(train: TrainSpec, steps_per_epoch: int) -> int:
    """The warm-up's steps W = ceil(lr_warmup_epochs x steps an epoch); none if W <= 1."""
    steps = math.ceil(train.lr_warmup_epochs * steps_per_epoch)
    return steps if steps > 1 else 0


def schedule(optimizer: torch.optim.Optimizer, train: TrainSpec,
             steps_per_epoch: int) -> Scheduler | None:
    """The learning rate's schedule of a run, None where it stays at lr: the linear
    warm-up (its W first steps at lr x s / W for step s: Goyal et al. 2017's gradual
    warm-up, torch's LinearLR), then ``lr_schedule`` over the run's other steps."""
    warm = warmup_steps(train, steps_per_epoch)
    first = lr_scheduler.LinearLR(optimizer, start_factor=1 / warm, total_iters=warm - 1) \
        if warm else None
    if train.lr_schedule == "none":
        return first
    lr = optimizer.param_groups[0].get("initial_lr", optimizer.param_groups[0]["lr"])
    steps = train.epochs * steps_per_epoch - warm
    then = schedule_class(train.lr_schedule)(optimizer, **_schedule_args(train, lr, steps))
    if first is None:
        return then
    return lr_scheduler.SequentialLR(optimizer, [first, then], milestones=[warm])


def _accepts(cls: type, args: dict[str, Any], key: str, ours: tuple[str, ...]) -> None:
    """Refuse an argument ``cls`` does not take, or one it needs and is not given."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
             and p.name not in ours]
    takes = {p.name for p in named}
    for name in args:
        if name not in takes:
            raise ConfigError(f"{key}.{name}", f"is not an argument of {cls.__name__}, "
                              f"which takes: {', '.join(sorted(takes))}")
    needed = [p.name for p in named if p.default is p.empty and p.name not in args]
    if needed:
        raise ConfigError(key, f"{cls.__name__} needs {', '.join(needed)}: give "
                          f"{'them' if len(needed) > 1 else 'it'} in [{key}]")


def _made(key: str, name: str, make: Any) -> Any:
    try:
        return make()
    except (TypeError, ValueError, RuntimeError, KeyError) as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ConfigError(key, f"{name} refuses them: {first}") from None


def check(train: TrainSpec, lr: float | None = None) -> None:
    """Refuse (ConfigError naming the key) an optimizer or a schedule torch does not have
    or cannot step per batch, an argument its class does not take, or a value it refuses
    (each is made once, on one weight)."""
    lr = train.lr if lr is None else lr
    cls = optimizer_class(train.optimizer)
    _accepts(cls, train.optimizer_args or {}, "train.optimizer_args", ("params", "lr"))
    weight = torch.nn.Parameter(torch.zeros(2, 2))
    optimizer = _made("train.optimizer_args", train.optimizer,
                      lambda: cls([weight], **optimizer_args(train, lr)))
    if train.lr_schedule == "none":
        if train.lr_schedule_args:
            raise ConfigError("train.lr_schedule_args", "give them with a train.lr_schedule")
        return
    scheduler = schedule_class(train.lr_schedule)
    args = _schedule_args(train, lr, 100)
    _accepts(scheduler, args, "train.lr_schedule_args", ("optimizer",))
    _made("train.lr_schedule_args", scheduler.__name__, lambda: scheduler(optimizer, **args))
