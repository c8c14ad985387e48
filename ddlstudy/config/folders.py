"""Use cases of a folder of one's own images: its classes (its class folders), a use case
of the folder alone, and a starter TOML naming it (``ddlstudy usecase new``). Torch-free:
the command line reads a folder's classes before torch is imported."""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from pathlib import Path

from ddlstudy.config.loading import usecase_from_dict
from ddlstudy.config.usecase import DataSpec, ModelSpec, TrainSpec, UseCase
from ddlstudy.errors import ConfigError
from ddlstudy.reading import what_is


def class_folders(folder: Path, field: str = "--data-dir") -> tuple[str, ...]:
    """An ImageFolder tree's classes: its visible sub-folders, sorted as ImageFolder sorts
    them (the label of each is its index); a refusal names ``field``, where the folder was
    given (the flag, or a use case's key)."""
    folder = Path(folder)
    if not folder.is_dir():
        there = what_is(folder)  # not opened: a FIFO would block
        it = f"it is {there}" if there else "it does not exist"
        raise ConfigError(field, f"{folder} is not a folder ({it}); give the root of an "
                          f"ImageFolder tree (root/<class>/<image>)")
    found = tuple(sorted(p.name for p in folder.iterdir() if p.is_dir() and
                         not p.name.startswith(".")))
    if len(found) < 2:
        raise ConfigError(field, f"{folder} has {len(found)} class folder(s); an ImageFolder "
                          f"tree has one folder per class, at least two (root/<class>/<image>)")
    return found


def usecase_key(usecase: UseCase, key: str) -> str:
    """How a refusal names ``key`` of ``usecase``: with the file it was written in (``model.arch
    in path/to/u.toml``), where it came from one."""
    return f"{key} in {usecase.source}" if usecase.source else key


def with_classes(usecase: UseCase, folder: Path) -> UseCase:
    """``usecase`` with its classes, where it names none, read from ``folder``'s class
    folders (its own [data] dir, or --data-dir's)."""
    if usecase.classes is not None:
        return usecase
    given = usecase.data.dir is None or Path(folder) != usecase.data.dir
    field = "--data-dir" if given else usecase_key(usecase, "data.dir")
    return dataclasses.replace(usecase, classes=class_folders(folder, field))


def usecase_of_folder(folder: Path, model: str) -> UseCase:
    """A use case of a folder of images alone: named after it, its classes its class
    folders, ``model``, and the default training task (which flags override)."""
    folder = Path(folder).resolve()
    data = DataSpec(dir=folder)
    return UseCase(name=data.name, description=f"the images of {folder}",
                   classes=class_folders(folder), model=ModelSpec(arch=model), data=data)


STARTER = """# A use case of your own: a model and a folder of images. Train it with
#   ddlstudy run --usecase {path}
# Every key is shown; those commented out keep the default written beside them.
name = {name}
description = {description}
# classes = [{classes}]  # default: the folder's class folders, sorted (label order)

[model]
arch = {model}  # any torchvision classification model (`ddlstudy models`), alexnet or
# vgg16, path/to/file.py:FUNCTION or package.module:FUNCTION (FUNCTION(num_classes=N)
# returns an nn.Module), timm:NAME
# width = {width}  # alexnet and vgg16 only: their channels and hidden units scaled down

[data]
dir = {dir}  # an ImageFolder tree (root/<class>/<image>), relative to this file
# name = {data_name}  # how run folders and the decoded cache name it
# flip = {flip}  # training images flipped left-right at random (false for digits, text)
# crop_scale = {crop_scale}  # random resized crops of [crop_scale, 1] of the area (1: none)
# normalize = {normalize}  # imagenet, dataset (its own mean and std) or none

[train]
image_size = {image_size}  # side in pixels the images are scaled to
# batch_size = {batch_size}  # the global batch (see --scaling)
# epochs = {epochs}
# lr = {lr}  # the learning rate (see --lr-scaling)
# lr_warmup_epochs = {lr_warmup_epochs}  # epochs the rate rises over to lr (0: none)
# optimizer = {optimizer}  # a torch.optim class by name: SGD, Adam, AdamW, RMSprop, ...
# momentum = {momentum}  # SGD's
# lr_schedule = {lr_schedule}  # after the warm-up: step, cosine, onecycle or torch's by name
# seed = {seed}  # of the weights, the shuffling and the augmentation
# val_fraction = {val_fraction}  # of each class's images, kept for validation
# target_accuracy: none by default (no time to accuracy is measured); set it, e.g. to
# 0.9, and the first epoch at or above it gives the run's time to accuracy
# target_metric = {target_metric}  # what target_accuracy is a threshold of: accuracy or macro_f1

# [train.optimizer_args]  # the optimizer's keyword arguments but lr (default: torch's),
#   e.g. weight_decay = 0.05 (AdamW), nesterov = true (SGD)
# [train.lr_schedule_args]  # the schedule's (default: over the whole run),
#   e.g. eta_min = 1e-5 (cosine)
"""
STARTER_DEFAULTS = {"width": ModelSpec, "batch_size": TrainSpec, "epochs": TrainSpec,
                    "lr": TrainSpec, "lr_warmup_epochs": TrainSpec, "momentum": TrainSpec,
                    "optimizer": TrainSpec, "lr_schedule": TrainSpec, "flip": DataSpec,
                    "crop_scale": DataSpec, "normalize": DataSpec,
                    "seed": TrainSpec, "val_fraction": TrainSpec, "target_metric": TrainSpec}
"""The keys a starter use case writes commented out, with the real default of each."""


def _defaults() -> dict[str, str]:
    """Each of ``STARTER_DEFAULTS`` as TOML: the default its declaration gives."""
    fields = {f.name: f for cls in set(STARTER_DEFAULTS.values())
              for f in dataclasses.fields(cls)}
    return {k: json.dumps(fields[k].default) for k in STARTER_DEFAULTS}


def _toml(text: str) -> str:
    """``text`` as a TOML basic string (JSON's escapes are TOML's; TOML also escapes DEL)."""
    return json.dumps(str(text), ensure_ascii=False).replace("\x7f", "\\u007f")


FLAGS = {"name": "--name", "model.arch": "--model", "model.width": "--model",
         "train.image_size": "--image-size", "data.dir": "--data-dir"}
"""The keys of a starter use case and the flags of `ddlstudy usecase new` they come from:
a refusal names what the user typed."""


def starter(folder: Path, model: str, image_size: int, path: Path,
            name: str | None = None) -> str:
    """A use case TOML for ``folder``'s images, every key written out (``ddlstudy usecase
    new``), checked by reading it back: a refusal names the flag the value came from."""
    try:
        return _starter(Path(folder).resolve(), model, image_size, Path(path).resolve(), name)
    except ConfigError as exc:
        if exc.field not in FLAGS:
            raise
        raise ConfigError(FLAGS[exc.field], str(exc)[len(exc.field) + 2:]) from None


def _starter(folder: Path, model: str, image_size: int, path: Path, name: str | None) -> str:
    classes = class_folders(folder)
    where = os.path.relpath(folder, path.parent)  # the use case moves with its images
    data = DataSpec(dir=folder)
    spec = ModelSpec(arch=model).anchored(Path.cwd())  # a file of yours: from here
    if spec.kind == "file":  # written relative to the use case, which moves with it
        where_, _, function = str(spec.arch).rpartition(":")
        model = f"{os.path.relpath(where_, path.parent)}:{function}"
    text = STARTER.format(path=path.name, name=_toml(name or data.name), model=_toml(model),
                          description=_toml(f"the images of {folder.name}"),
                          classes=", ".join(_toml(c) for c in classes), dir=_toml(where),
                          data_name=_toml(data.name), image_size=image_size, **_defaults())
    usecase_from_dict(tomllib.loads(text), source=str(path))  # refused here if bad
    return text
