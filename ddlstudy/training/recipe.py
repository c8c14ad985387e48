"""The recipe a use case declares, made with torch: its optimizer (``[train] optimizer`` and
``optimizer_args``: the paper's SGD with ``train.momentum`` by default) and its learning
rate's schedule (``lr_schedule`` and ``lr_schedule_args``, after the linear warm-up of
``lr_warmup_epochs``, stepped per optimizer step), every name and argument checked against
torch's own classes before anything starts (``check``, from preflight)."""

from __future__ import annotations

import difflib
import inspect
import json
import math
import re
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim import lr_scheduler

from ddlstudy.config import TrainSpec
from ddlstudy.config.recipe import SGD
from ddlstudy.errors import ConfigError
from ddlstudy.training.signature import fits, hints, takes

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
_PERIOD = (1, False, "a period of no steps divides by zero at the first step")
BOUNDS = {**dict.fromkeys(("step_size", "T_max", "T_0", "total_iters", "total_steps",
                           "step_size_up", "step_size_down", "epochs", "steps_per_epoch"),
                          _PERIOD),
          "power": (0, False, "a negative power divides by zero at the schedule's end"),
          "gamma": (0, True, "a factor of 0 or below stops or reverses learning")}
"""The schedules' arguments torch takes without checking their range: (lowest, whether
the lowest itself is refused, what it would do)."""
SIMULATED_STEPS = 20_000
"""The run's first steps a schedule is stepped through before the run (about 15 us a step
on one core: 0.3 s at most); past them, ``BOUNDS`` stand for the rest."""


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
    """Refuse an argument ``cls`` does not take, or one of another type than its
    signature's (``signature``) or below its ``BOUNDS``."""
    known = {name: hint for name, (hint, _) in hints(cls).items() if name not in ours}
    for name, value in args.items():
        if name not in known:
            raise ConfigError(f"{key}.{name}", f"is not an argument of {cls.__name__}, "
                              f"which takes: {', '.join(sorted(known))}")
        if not fits(value, known[name]):
            what = takes(known[name]) or "what a table cannot hold"
            raise ConfigError(f"{key}.{name}", f"{cls.__name__} takes {what}, got "
                              f"{json.dumps(value)[:60]}")
        low, above, why = BOUNDS.get(name, (None, False, ""))
        if low is not None and isinstance(value, int | float) and \
                (value <= low if above else value < low):
            raise ConfigError(f"{key}.{name}", f"must be {'above' if above else 'at least'} "
                              f"{low} ({why}), got {value!r}")


def _needs(cls: type, args: dict[str, Any], key: str, ours: tuple[str, ...]) -> None:
    """Refuse ``args`` (the defaults ddlstudy gives and the use case's) that leave out one
    ``cls`` needs."""
    needed = [n for n, (_, default) in hints(cls).items() if n not in ours
              and default is inspect.Parameter.empty and n not in args]
    if needed:
        raise ConfigError(key, f"{cls.__name__} needs {', '.join(needed)}: give "
                          f"{'them' if len(needed) > 1 else 'it'} in [{key}]")


FAILURES = (TypeError, ValueError, RuntimeError, KeyError, IndexError, AssertionError,
            ZeroDivisionError, OverflowError)
"""What torch raises for a value it refuses (an assertion for ``capturable`` on the CPU)."""


def _made(key: str, name: str, make: Any, args: dict[str, Any], when: str = "") -> Any:
    """``make()``, or a refusal naming ``key`` (the argument torch's message names, where
    it names one of ``args``) and torch's first line."""
    try:
        return make()
    except FAILURES as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        named = next((a for a in args if re.search(rf"\b{a}\b", first)), None)
        where = f"{key}.{named}" if named else key
        raise ConfigError(where, f"{name} refuses {'it' if named else 'them'}{when}: "
                          f"{first}") from None


def check(train: TrainSpec, lr: float | None = None, device: str = "cpu",
          steps_per_epoch: int | None = None) -> None:
    """Refuse (ConfigError naming the key and what it takes) an optimizer or a schedule
    torch does not have or cannot step per batch, an argument its class does not take or
    of another type or range than it takes, or a value torch refuses: the optimizer is
    made on one weight of ``device`` and takes a step (where this machine has one), and
    the schedule is made as the run makes it, over ``steps_per_epoch`` (where known), and
    stepped through the run's steps (its first ``SIMULATED_STEPS``)."""
    lr = train.lr if lr is None else lr
    cls = optimizer_class(train.optimizer)
    given = train.optimizer_args or {}
    _accepts(cls, given, "train.optimizer_args", ("params", "lr"))
    _needs(cls, given, "train.optimizer_args", ("params", "lr"))
    here = device if device == "cpu" or torch.cuda.is_available() else None
    weight = torch.nn.Parameter(torch.zeros(2, 2, device=here or "cpu"))
    optimizer = _made("train.optimizer_args", train.optimizer,
                      lambda: cls([weight], **optimizer_args(train, lr)), given)
    if here is not None:  # a flag this device cannot take fails at the first step
        weight.grad = torch.ones_like(weight)
        _made("train.optimizer_args", train.optimizer, optimizer.step, given,
              f" on {device}")
    if train.lr_schedule == "none":
        if train.lr_schedule_args:
            raise ConfigError("train.lr_schedule_args", "give them with a train.lr_schedule")
        return
    _check_schedule(train, optimizer, lr, steps_per_epoch)


def _check_schedule(train: TrainSpec, optimizer: torch.optim.Optimizer, lr: float,
                    steps_per_epoch: int | None) -> None:
    key, given = "train.lr_schedule_args", train.lr_schedule_args or {}
    scheduler = schedule_class(train.lr_schedule)
    _accepts(scheduler, given, key, ("optimizer", "last_epoch"))
    per_epoch = steps_per_epoch or 100
    total = train.epochs * per_epoch
    run = total - warmup_steps(train, per_epoch)
    if steps_per_epoch and scheduler is lr_scheduler.OneCycleLR and \
            (given.get("total_steps") or run) < run:
        raise ConfigError(f"{key}.total_steps", f"OneCycleLR's cycle of "
                          f"{given['total_steps']} steps would end before the run's {run} "
                          f"({train.epochs} epochs of {steps_per_epoch}); give at least "
                          f"{run}, or leave it out (the run's steps)")
    _needs(scheduler, _schedule_args(train, lr, run), key, ("optimizer", "last_epoch"))
    with warnings.catch_warnings():  # torch's, of a step before the optimizer's
        warnings.simplefilter("ignore")
        made = _made(key, scheduler.__name__, lambda: schedule(optimizer, train, per_epoch),
                     given)
        _simulate(made, optimizer, key, given, min(total, SIMULATED_STEPS)
                  if steps_per_epoch else 2)


def _simulate(made: Scheduler, optimizer: torch.optim.Optimizer, key: str,
              given: dict[str, Any], steps: int) -> None:
    """Step ``made`` as the run steps it, after each of its first ``steps`` steps: what
    fails late (a division by zero, a step past a cycle's end, a rate that is no number)
    fails here."""
    name = type(made).__name__
    for step in range(1, steps + 1):
        _made(key, name, made.step, given, f" at the run's step {step}")
        rate = optimizer.param_groups[0]["lr"]
        if not math.isfinite(rate) or rate < 0:
            raise ConfigError(key, f"{name} gives a learning rate of {rate} at the run's "
                              f"step {step}; check its arguments")
