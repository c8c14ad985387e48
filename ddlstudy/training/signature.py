"""What a torch class's keyword arguments take, read from its own signature: the type each
is annotated with (``betas: tuple[float, float]``, ``T_max: int``, ``foreach: bool | None``,
``mode: Literal['triangular', ...]``), or, where its annotation cannot be read, its
default's. A value from a use case's table is checked against it before torch sees it:
torch indexes ``betas[1]`` without checking the length (an IndexError), and takes a float
``step_size`` or a text ``gamma`` until the first step fails."""

from __future__ import annotations

import collections.abc
import inspect
import sys
import types
import typing
from typing import Any, Literal, Union

import torch

_EVERY = {**vars(typing), **vars(collections.abc), "torch": torch, "Tensor": torch.Tensor,
          "Optimizer": torch.optim.Optimizer,
          "LRScheduler": torch.optim.lr_scheduler.LRScheduler}
"""Names torch's string annotations use (``Sequence[LRScheduler]``, ``Callable[...]``)."""
UNKNOWN = object()
"""An annotation that could not be read: the default's type says what it takes."""
_SEQUENCES = (list, tuple, collections.abc.Sequence, collections.abc.Iterable)


def hints(cls: type) -> dict[str, tuple[Any, Any]]:
    """``cls.__init__``'s keyword arguments: name -> (annotation or UNKNOWN, default)."""
    module = vars(sys.modules.get(cls.__module__, torch))
    out = {}
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        annotation = p.annotation
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, module | _EVERY)  # noqa: S307 - torch's own text
            except Exception:  # noqa: BLE001 - a name torch's module does not hold
                annotation = UNKNOWN
        if annotation is p.empty:
            annotation = UNKNOWN
        out[p.name] = (_of_default(p.default) if annotation is UNKNOWN else annotation,
                       p.default)
    return out


def _of_default(default: Any) -> Any:
    """What a default without an annotation says its argument takes (anything, if None)."""
    if default is inspect.Parameter.empty or default is None:
        return Any
    if isinstance(default, tuple):
        return tuple[tuple(_of_default(d) for d in default)]
    return float if type(default) is int else type(default)  # 0 stands for 0.0 too


def fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` (as JSON or TOML gives it) is of type ``hint``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    if origin in (Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if hint in (bool, int, float, str):
        return _scalar(value, hint)
    if origin in _SEQUENCES and isinstance(value, list | tuple):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return len(value) == len(args) and all(map(fits, value, args))
        return all(fits(v, args[0]) for v in value) if args else True
    return False  # a tensor, a function, an optimizer: nothing a table holds


def _scalar(value: Any, hint: type) -> bool:
    if hint is bool or isinstance(value, bool):
        return hint is bool and isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float)
    return isinstance(value, hint)


_NOUNS = {bool: ("true or false", "true or false values"), int: ("a whole number",
                                                                  "whole numbers"),
          float: ("a number", "numbers"), str: ("a text", "texts"),
          type(None): ("null", "nulls")}


def takes(hint: Any, plural: bool = False) -> str:
    """What ``hint`` takes, in words (``a list of 2 numbers``, ``true, false or null``);
    '' for what a table cannot hold."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return "any value"
    if hint in _NOUNS or hint is None:
        return _NOUNS[hint or type(None)][plural]
    if origin in (Union, types.UnionType):
        said = list(dict.fromkeys(w for w in (takes(a, plural) for a in args) if w))
        return said[0] if len(said) == 1 else ", ".join(said[:-1]) + " or " + said[-1]
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in _SEQUENCES:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            each = list(dict.fromkeys(takes(a, True) for a in args))
            inner = each[0] if len(each) == 1 else \
                f"values ({', then '.join(takes(a) for a in args)})"
            return f"a list of {len(args)} {inner}"
        return f"a list of {takes(args[0], True) if args else 'values'}"
    return ""
