"""Where a model comes from, by the kind of its name (``ModelSpec.kind``): the paper's
networks, torchvision's classification models, timm's, or a factory of one's own (a
file's or a module's function). Each is built with fresh weights and ``num_classes``
outputs, never downloaded; a name that cannot be built is refused with what to give
instead (``ConfigError`` on ``--model``)."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ddlstudy import signals
from ddlstudy.config import ModelSpec
from ddlstudy.config.usecase import FACTORY, TIMM
from ddlstudy.errors import ConfigError
from ddlstudy.reading import CAPS, read_bytes

if TYPE_CHECKING:  # torch is imported where a model is made, not to name one or check it
    from torch import nn

log = logging.getLogger("ddlstudy")
FLAG = "--model"
"""How a refusal of the model names it (here and in ``ddlstudy.models``): the flag, unless
the caller says, by ``named``, where else the name came from."""
TORCHVISION_EXTRA = {"googlenet": {"aux_logits": False, "init_weights": True},
                     "inception_v3": {"aux_logits": False, "init_weights": True}}
"""torchvision's two models with auxiliary heads: built without them, so that training
gets one output (and with torchvision's initialisation, without its warning)."""


@contextmanager
def named(field: str) -> Iterator[None]:
    """Refusals of the model inside (``FLAG``'s) name ``field`` instead: where its name
    came from, when not from --model (``model.arch in u.toml``, a run's manifest). Every
    refusal of a model, whoever builds it, is renamed here, at one place."""
    try:
        yield
    except ConfigError as exc:
        if exc.field != FLAG or field == FLAG:
            raise
        raise type(exc)(field, str(exc)[len(FLAG) + 2:]) from None


@contextmanager
def _staying(what: str) -> Iterator[None]:
    """Someone else's code (``what``) run where it cannot move ddlstudy: a working
    directory it changes is changed back (every path ddlstudy writes to is absolute
    before it runs, ``RunConfig``; this keeps the rest of the process where it was)."""
    cwd = os.getcwd()
    try:
        yield
    finally:
        if os.getcwd() != cwd:
            log.warning("%s changed the working directory to %s; changed back to %s", what,
                        os.getcwd(), cwd)
            os.chdir(cwd)


BUILD_LIMIT_S = 600.0
"""How long building a model may take where no set-up limit (a study's
``setup_timeout_s``) is running: torchvision's largest builds in seconds here; a maker past
this has hung (a factory that waits for ever, or that swallows every exception)."""


def _within_limit(make: Callable[..., nn.Module], spec: ModelSpec, num_classes: int,
                  alongside: Callable[[], object] | None = None):
    """``make(num_classes=...)`` in a thread of its own (on this thread's default device,
    meta included), waited for until the running set-up limit (``signals.time_limit``),
    which stops the wait even where the maker swallows every exception or ignores
    signals, or else for ``BUILD_LIMIT_S``; a maker past it is refused (its thread is
    left, asleep or spinning, a daemon). ``alongside`` runs in this thread meanwhile."""
    import torch

    device, done = torch.get_default_device(), []

    def build() -> None:
        try:
            with torch.device(device) if device.type != "cpu" else contextlib.nullcontext():
                done.append(make(num_classes=num_classes))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            done.append(exc)

    thread = threading.Thread(target=build, name=f"ddlstudy-build-{spec.arch}", daemon=True)
    thread.start()
    if alongside is not None:
        alongside()
    thread.join(None if signals.limited() else BUILD_LIMIT_S)
    if not done:
        raise ConfigError(FLAG, f"{spec.arch}(num_classes={num_classes}) has not returned "
                          f"after {BUILD_LIMIT_S:g} s; a model's maker that takes this long "
                          f"has hung: check it")
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


@lru_cache(maxsize=1)
def torchvision_names() -> tuple[str, ...]:
    """torchvision's classification models (``list_models`` of its ``models`` module)."""
    from torchvision import models  # 2 s of imports: only when a name is looked up

    return tuple(models.list_models(module=models))


def _torchvision(name: str) -> Callable[..., nn.Module]:
    known = torchvision_names()
    if name not in known:
        near = difflib.get_close_matches(name, known, n=4, cutoff=0.6)
        hint = f"the nearest torchvision names: {', '.join(near)}; " if near else ""
        raise ConfigError(FLAG, f"unknown model {name!r}; {hint}`ddlstudy models` lists "
                          f"the names, or give path/to/file.py:FUNCTION of your own")
    from torchvision import models

    extra = TORCHVISION_EXTRA.get(name, {})
    return lambda num_classes: models.get_model(name, weights=None, num_classes=num_classes,
                                                **extra)


def _timm(name: str) -> Callable[..., nn.Module]:
    try:
        import timm
    except ImportError:
        raise ConfigError(FLAG, f"{TIMM}{name} needs timm, which is not installed: pip "
                          f"install timm, or name a torchvision model") from None
    if name not in timm.list_models():
        near = difflib.get_close_matches(name, timm.list_models(), n=4, cutoff=0.6)
        raise ConfigError(FLAG, f"timm has no model {name!r}"
                          + (f"; the nearest: {', '.join(near)}" if near else ""))
    return lambda num_classes: timm.create_model(name, pretrained=False,
                                                 num_classes=num_classes)


def sha256_of(path: Path) -> str:
    """The file's sha256, read through the gate (a FIFO or device is refused, not read)."""
    return hashlib.sha256(read_bytes(path, "model file", CAPS["table"])).hexdigest()


@lru_cache(maxsize=16)
def _load_file(path: str, digest: str) -> ModuleType:
    """The module of a factory file, once per process and content (its name carries the
    digest, so an edited file is a new module)."""
    name = f"ddlstudy_model_{digest[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an imported module is: copy.deepcopy and pickle find it
    with _staying(f"importing {path}"):
        spec.loader.exec_module(module)
    return module


def _factory(where: str, function: str, kind: str) -> Callable[..., nn.Module]:
    try:
        if kind == "file":
            if not Path(where).is_file():
                what = "is not a file" if Path(where).exists() else "does not exist"
                raise ConfigError(FLAG, f"{where} {what}; give path/to/file.py:FUNCTION "
                                  f"(relative to the use case's file, or to the working "
                                  f"directory for --model)")
            module = _load_file(where, sha256_of(Path(where)))
        elif "/" in where or "\\" in where:
            raise ConfigError(FLAG, f"{where} is neither a .py file nor a module's dotted "
                              f"name; give path/to/file.py:FUNCTION or package.module:"
                              f"FUNCTION")
        else:
            with _staying(f"importing {where}"):
                module = importlib.import_module(where)
    except ConfigError:
        raise
    except (Exception, SystemExit) as exc:  # someone else's code, any error (exit too)
        raise ConfigError(FLAG, f"could not import {where}: {type(exc).__name__}: "
                          f"{exc}") from None
    make = getattr(module, function, None)
    if not callable(make):
        have = sorted(n for n, v in vars(module).items() if callable(v) and n[0] != "_"
                      and getattr(v, "__module__", None) == module.__name__)
        raise ConfigError(FLAG, f"{where} has no function {function}"
                          + (f" (it has: {', '.join(have)})" if have else ""))
    return make


def maker(spec: ModelSpec) -> Callable[[int], nn.Module]:
    """``make(num_classes)`` for ``spec``, or a ConfigError saying why there is none."""
    kind = spec.kind
    if kind == "torchvision" and (":" in spec.arch or spec.arch.endswith(".py")):
        raise ConfigError(FLAG, f"{spec.arch!r} names no model: a function of yours is "
                          f"path/to/file.py:FUNCTION or package.module:FUNCTION, FUNCTION a "
                          f"Python name (the function that builds the network)")
    if kind == "paper":
        from ddlstudy.models.paper import build_paper

        return lambda num_classes: build_paper(spec, num_classes)
    if kind == "torchvision":
        return _torchvision(str(spec.arch))
    if kind == "timm":
        return _timm(spec.arch.removeprefix(TIMM))
    found = FACTORY.fullmatch(spec.arch)
    return _factory(found["where"], found["function"], kind)


def made(spec: ModelSpec, num_classes: int,
         alongside: Callable[[], object] | None = None) -> nn.Module:
    """The model, checked to be an ``nn.Module`` (a factory of one's own may return
    anything, or raise). ``alongside``: run meanwhile, where the maker is the paper's (its
    modules imported, it imports none as it builds: ``tests/test_models.py``; its weights
    drawn with the GIL released), else first: another's maker may import modules, and
    two threads importing crossing graphs of modules can deadlock."""
    from torch import nn

    make, failed = maker(spec), []
    if alongside is not None and spec.kind != "paper":
        alongside()
        alongside = None

    def meanwhile() -> None:  # its failure is its own, said once the model is built
        try:
            alongside()
        except Exception as exc:  # noqa: BLE001 - raised again below, not the model's
            failed.append(exc)

    try:
        with _staying(f"{spec.arch}(num_classes={num_classes})"):
            model = _within_limit(make, spec, num_classes,
                                  None if alongside is None else meanwhile)
    except ConfigError:
        raise
    except (Exception, SystemExit) as exc:  # someone else's code, any error (exit too)
        raise ConfigError(FLAG, f"{spec.arch}(num_classes={num_classes}) raised "
                          f"{type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(FLAG, f"{spec.arch}(num_classes={num_classes}) returned "
                          f"{type(model).__name__}, not a torch.nn.Module")
    if any(isinstance(p, nn.parameter.UninitializedParameter) for p in model.parameters()):
        raise ConfigError(FLAG, f"{spec.arch} has lazy layers (nn.LazyLinear, ...), whose "
                          f"weights have no shape before a first forward pass; ddlstudy "
                          f"counts, shares and cuts weights before training: give their "
                          f"sizes (nn.Linear)")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(FLAG, f"{spec.arch} has no weight to train (none, or all with "
                          f"requires_grad False)")
    if failed:
        raise failed[0]
    return model


def origin(spec: ModelSpec) -> dict[str, Any]:
    """Where the model comes from, for the manifest: the library and its version, or the
    factory file's sha256."""
    kind = spec.kind
    if kind in ("paper", "torchvision", "timm"):  # the installed version, not imported
        library = "timm" if kind == "timm" else "torchvision"
        return {"kind": kind, library: metadata.version(library)}
    where = FACTORY.fullmatch(spec.arch)["where"]
    if kind == "file":
        return {"kind": kind, "file": where, "sha256": sha256_of(Path(where))}
    module = importlib.import_module(where)
    file = getattr(module, "__file__", None)
    return {"kind": kind, "module": where,
            **({"file": file, "sha256": sha256_of(Path(file))} if file else {})}

