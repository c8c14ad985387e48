"""Use cases (TOML files in usecases/): a model, a data set and the training task.

Every section is a frozen, keyword-only dataclass: its fields declare the TOML keys (type,
default and, in their docstrings, meaning), which pydantic checks when a file is read
(``config.loading``: strict types, no unknown key; ``config.schema``), and its
``__post_init__`` checks the ranges and the rules between fields, naming the offending key,
so a bad TOML key or CLI flag is refused before anything starts. The docs' reference of the
keys is generated from these same declarations (``ddlstudy.records.formats.reference``).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlstudy.config.limits import most, why
from ddlstudy.config.recipe import ARGUMENT, SELF_WARMING, SGD, accuracy, arguments, metric, table
from ddlstudy.config.schema import WRITTEN
from ddlstudy.errors import ConfigError

PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""A name that is one path component and no more (use cases, run ids)."""


class Arch(enum.StrEnum):
    """The paper's networks, which ``width`` can scale down."""

    ALEXNET = "alexnet"
    VGG16 = "vgg16"


FACTORY = re.compile(r"^(?P<where>[^:\s]+):(?P<function>[A-Za-z_][A-Za-z0-9_]*)$")
"""A factory of one's own: ``path/to/file.py:FUNCTION`` or ``package.module:FUNCTION``."""
TIMM = "timm:"


class BadImagePolicy(enum.StrEnum):
    FAIL = "fail"
    SKIP = "skip"


def _choices(enum_cls: type[enum.StrEnum]) -> str:
    return ", ".join(m.value for m in enum_cls)


def _positive(name: str, value: Any, kind: type = int, most: float | None = None,
              why: str = "") -> None:
    """A positive, finite ``kind`` (an int is a float too), at most ``most`` (``why``
    says what a larger value would do)."""
    if isinstance(value, bool) or not isinstance(value, kind | int) or \
            not math.isfinite(value) or value <= 0:
        raise ConfigError(name, f"must be a positive {kind.__name__}, got {value!r}")
    if most is not None and value > most:
        raise ConfigError(name, f"{value!r} is above the limit of {most:g}{why}")


def _number(name: str, value: Any, low: float, high: float, high_open: bool = False) -> None:
    """A finite number in [low, high] (or [low, high) with ``high_open``)."""
    inside = (isinstance(value, int | float) and not isinstance(value, bool)
              and math.isfinite(value) and low <= value and
              (value < high if high_open else value <= high))
    if not inside:
        raise ConfigError(name, f"must be a number in [{low:g}, {high:g}"
                          f"{')' if high_open else ']'}, got {value!r}")


SEED_MAX = 2**63 - 1
"""Seeds go to torch.manual_seed and numpy, which take a signed 64-bit integer."""
MAX_IMAGES = most("images")
"""A synthetic set larger than this would take hours and tens of GB: use --data-dir."""
MAX_PIXELS = most("pixels")
"""Images larger than this per side exhaust memory before training starts."""


def _seed(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise ConfigError(name, f"must be an integer from 0 to 2**63-1, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Which network to train, by name (``ddlstudy.models`` builds it and answers what it
    is: its weights, buffers, smallest image, where a pipeline may cut it)."""

    __pydantic_config__ = WRITTEN

    arch: str
    """``alexnet`` or ``vgg16`` (the paper's, at ``width``); any classification model of
    torchvision by its name (``resnet18``, ``mobilenet_v3_small``, ...); a factory of one's
    own, ``path/to/file.py:FUNCTION`` (relative to the use case's file, or to the working
    directory for ``--model``) or ``package.module:FUNCTION``, called as
    ``FUNCTION(num_classes=N)``; or ``timm:NAME`` where timm is installed."""
    width: float = 1.0
    """alexnet's and vgg16's channel and hidden-unit multiplier; 1.0 is torchvision's own
    model."""

    def __post_init__(self) -> None:
        if not isinstance(self.arch, str) or not self.arch.strip() or \
                any(c.isspace() for c in self.arch):
            raise ConfigError("model.arch", f"must be a model's name (e.g. resnet18, or "
                              f"path/to/file.py:FUNCTION), got {self.arch!r}")
        if self.arch in tuple(Arch):
            object.__setattr__(self, "arch", Arch(self.arch))
        if isinstance(self.width, bool) or not isinstance(self.width, int | float) or \
                not 0 < self.width <= 1:
            raise ConfigError("model.width", f"must be in (0, 1], got {self.width!r}")
        if self.width != 1 and not isinstance(self.arch, Arch):
            raise ConfigError("model.arch", f"{self.arch} is built as its maker builds it, "
                              f"so model.width ({self.width}) cannot scale it: leave width "
                              f"out, or use {_choices(Arch)}")

    @property
    def kind(self) -> str:
        """paper, torchvision, timm, file or module."""
        if isinstance(self.arch, Arch):
            return "paper"
        if self.arch.startswith(TIMM):
            return "timm"
        found = FACTORY.fullmatch(self.arch)
        if found is None:
            return "torchvision"
        return "file" if found["where"].endswith(".py") else "module"

    def anchored(self, folder: Path) -> ModelSpec:
        """This spec with a relative factory file taken from ``folder``."""
        found = FACTORY.fullmatch(self.arch) if self.kind == "file" else None
        if found is None or Path(found["where"]).is_absolute():
            return self
        where = (folder / found["where"]).resolve()
        return dataclasses.replace(self, arch=f"{where}:{found['function']}")


SYNTHETIC_CLASSES = ("fire", "smoke", "nofire")
"""The classes the synthetic generator draws."""
NORMALIZE = ("imagenet", "dataset", "none")
"""What ``data.normalize`` takes."""
SYNTHETIC_KEYS = ("images", "source_size", "difficulty", "label_noise")
"""The [data] keys that describe a synthetic set (a folder of one's own needs none)."""


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """The data a use case trains on: a folder of images of one's own (``dir``, an
    ImageFolder tree root/<class>/<image>), or a synthetic set generated into
    datasets/<name> (``images``, ``source_size``, ...)."""

    __pydantic_config__ = WRITTEN

    dir: Path | None = None
    """A folder of one's own images (relative to the use case's file); then the keys below
    but ``name`` are not given: nothing is generated."""
    name: str | None = None
    """Folder under datasets/ that holds the generated set (default: ``dir``'s name)."""
    images: int | None = None
    """Total number of images, split as evenly as possible between the classes."""
    source_size: int | None = None
    """Side in pixels of the generated images."""
    seed: int = 0
    """Seed of the generator: the same seed draws the same images, byte for byte."""
    difficulty: float = 0.5
    """0 (large, opaque flames and plumes, few look-alikes) to 1 (small, faint, many)."""
    label_noise: float = 0.0
    """Fraction of images drawn as another class than the folder they are filed under."""
    flip: bool = True
    """Flip each training image left to right at random (false where that changes what
    it shows: digits, text)."""
    crop_scale: float = 1.0
    """Random resized crop of each training image: a box of a random share of its area in
    [crop_scale, 1] (aspect ratio 3/4 to 4/3) scaled back to image_size; 1: none."""
    normalize: str = "imagenet"
    """What the pixels are normalised by, per channel: ``imagenet`` (ImageNet's mean and
    standard deviation, as torchvision's pretrained models expect), ``dataset`` (the data
    set's own, computed once over its images and recorded with its fingerprint) or
    ``none``."""

    def __post_init__(self) -> None:
        if self.dir is not None:
            if not isinstance(self.dir, str | Path) or not str(self.dir):
                raise ConfigError("data.dir", f"must be a folder's path, got {self.dir!r}")
            object.__setattr__(self, "dir", Path(self.dir))
            given = [k for k in ("images", "source_size") if getattr(self, k) is not None] + [
                k for k, default in (("seed", 0), ("difficulty", 0.5), ("label_noise", 0.0))
                if getattr(self, k) != default]
            if given:
                raise ConfigError("data.dir", f"names a folder of your own, and data."
                                  f"{given[0]} describes a synthetic set to generate: give "
                                  f"one or the other")
            object.__setattr__(self, "name", self.name or _plain(Path(self.dir).name))
        elif self.images is None or self.source_size is None:
            missing = "images" if self.images is None else "source_size"
            raise ConfigError(f"data.{missing}", "is required for a synthetic set; or give "
                              "data.dir, a folder of your own images (root/<class>/<image>)")
        if not isinstance(self.name, str) or not PLAIN_NAME.fullmatch(self.name):
            raise ConfigError("data.name", f"must be a plain folder name (letters, digits, "
                              f"'.', '_', '-'), got {self.name!r}")
        if self.dir is None:
            self._check_synthetic()
        if not isinstance(self.flip, bool):
            raise ConfigError("data.flip", f"must be true or false, got {self.flip!r}")
        _number("data.crop_scale", self.crop_scale, 0.01, 1)
        if self.normalize not in NORMALIZE:
            raise ConfigError("data.normalize", f"must be one of {', '.join(NORMALIZE)}, got "
                              f"{self.normalize!r:.40}")

    def _check_synthetic(self) -> None:
        _positive("data.images", self.images, most=MAX_IMAGES,
                  why=" (a synthetic set that large takes hours and tens of GB; train on a "
                  "real set with --data-dir)")
        _positive("data.source_size", self.source_size, most=MAX_PIXELS,
                  why=" px (larger images exhaust memory)")
        if self.source_size < 16:
            raise ConfigError("data.source_size", f"must be at least 16, got {self.source_size}")
        _seed("data.seed", self.seed)
        _number("data.difficulty", self.difficulty, 0, 1)
        _number("data.label_noise", self.label_noise, 0, 1, high_open=True)

    @property
    def synthetic(self) -> bool:
        return self.dir is None

    def anchored(self, folder: Path) -> DataSpec:
        """This spec with a relative ``dir`` taken from ``folder``."""
        if self.dir is None or self.dir.is_absolute():
            return self
        return dataclasses.replace(self, dir=(folder / self.dir).resolve())


def _plain(name: str) -> str:
    """``name`` as a plain folder name (what a run id may hold)."""
    plain = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:64]
    return plain or "data"


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """The training task: cross-entropy, stepped by the paper's SGD with momentum or the
    optimizer and learning-rate schedule named here (``ddlstudy.training.recipe`` checks
    their names and arguments against torch's before anything starts)."""

    __pydantic_config__ = WRITTEN

    image_size: int = field(default=224, metadata={
        "help": "side in pixels the images are scaled to", "type": int})
    batch_size: int = field(default=32, metadata={
        "help": "global batch size (see --scaling)", "type": int})
    epochs: int = field(default=10, metadata={"help": "epochs to train", "type": int})
    lr: float = field(default=0.001, metadata={
        "help": "learning rate (see --lr-scaling)", "type": float})
    optimizer: str = field(default=SGD, metadata={
        "help": "the optimizer, a torch.optim class by name: SGD (with train.momentum), "
                "Adam, AdamW, RMSprop, ...; its other arguments in --optimizer-args", "type": str,
        "metavar": "NAME"})
    optimizer_args: dict[str, Any] | None = field(default=None, hash=False, metadata={
        "help": "the optimizer's keyword arguments but lr, as a JSON object on the command "
                'line (\'{"weight_decay": 0.05}\') and as the table [train.optimizer_args] '
                "in a use case: weight_decay, betas, nesterov, eps, ... (default: torch's)",
        "type": table, "metavar": "JSON"})
    momentum: float = 0.9
    """SGD's momentum (another optimizer's, RMSprop's, goes in ``optimizer_args``)."""
    lr_schedule: str = field(default="none", metadata={
        "help": "the learning rate's schedule after the warm-up, stepped per optimizer "
                "step: none, step (x gamma=0.1 every step_size steps, default a third of "
                "the run's), cosine (to eta_min=0 at the run's end), onecycle (up to "
                "max_lr=lr and down over the run), or a torch.optim.lr_scheduler class by "
                "name; its arguments in --lr-schedule-args", "type": str, "metavar": "NAME"})
    lr_schedule_args: dict[str, Any] | None = field(default=None, hash=False, metadata={
        "help": "the schedule's keyword arguments, as a JSON object on the command line "
                "and the table [train.lr_schedule_args] in a use case (default: those "
                "--lr-schedule names)", "type": table, "metavar": "JSON"})
    lr_warmup_epochs: float = field(default=0, metadata={
        "help": "epochs over which the learning rate rises linearly to lr, from lr / W at "
                "the first of their W steps (torch's LinearLR; a step fp16's scaler skipped "
                "does not count; 0: none; not --warmup-steps, the steps left out of "
                "images/s)",
        "type": float})
    seed: int = field(default=0, metadata={
        "help": "seed of the weights, the shuffling and the augmentation", "type": int})
    val_fraction: float = 0.2
    """Share of each class's images kept for validation (a seeded split)."""
    target_accuracy: float | None = field(default=None, metadata={
        "help": "the value of --target-metric whose first epoch at or above it gives the "
                "run's time to target (default: the use case's; none: not measured)",
        "type": accuracy})
    target_metric: str = field(default="accuracy", metadata={
        "help": "the validation metric of time to target: accuracy, or macro_f1 (the "
                "classes' mean F1, for imbalanced classes)", "type": str, "metavar": "NAME"})

    def __post_init__(self) -> None:
        _positive("train.image_size", self.image_size, most=MAX_PIXELS, why=why("pixels"))
        _positive("train.batch_size", self.batch_size, most=most("batch"), why=why("batch"))
        _positive("train.epochs", self.epochs, most=most("epochs"))
        _positive("train.lr", self.lr, float, most=most("lr"), why=why("lr"))
        _number("train.momentum", self.momentum, 0, 1, high_open=True)
        self._check_recipe()
        # Longer than the run is allowed (its rate never reaches lr): tools that shorten
        # runs to an epoch or two (bench, advise, study --epochs) keep the use case's.
        _number("train.lr_warmup_epochs", self.lr_warmup_epochs, 0, most("epochs"))
        _number("train.val_fraction", self.val_fraction, 0, 1, high_open=True)
        if self.val_fraction == 0:
            raise ConfigError("train.val_fraction", "must be above 0: a run validates")
        _seed("train.seed", self.seed)
        metric("train.target_metric", self.target_metric)
        if self.target_accuracy is not None:
            _number("train.target_accuracy", self.target_accuracy, 0, 1)
            if self.target_accuracy == 0:
                raise ConfigError("train.target_accuracy", "must be above 0: every epoch "
                                  "would reach it; leave it out to measure no time to "
                                  "accuracy")


    def _check_recipe(self) -> None:
        """The names' form and the tables' keys (what they are to torch: ``recipe``)."""
        for name in ("optimizer", "lr_schedule"):
            value = getattr(self, name)
            if not isinstance(value, str) or not ARGUMENT.fullmatch(value):
                raise ConfigError(f"train.{name}", f"must be a class's name (e.g. "
                                  f"{'AdamW' if name == 'optimizer' else 'cosine'}), got "
                                  f"{value!r:.60}")
        arguments("train.optimizer_args", self.optimizer_args)
        arguments("train.lr_schedule_args", self.lr_schedule_args)
        args = self.optimizer_args or {}
        if self.optimizer == SGD and "momentum" in args:
            raise ConfigError("train.optimizer_args.momentum", "SGD's momentum is "
                              "train.momentum: give it there")
        if self.lr_schedule in SELF_WARMING and self.lr_warmup_epochs:
            raise ConfigError("train.lr_warmup_epochs", f"{self.lr_schedule} warms the "
                              f"learning rate up itself: give no warm-up")
        if self.optimizer != SGD and self.momentum != TrainSpec.momentum:
            raise ConfigError("train.momentum", f"is SGD's; {self.optimizer} takes its own "
                              f"arguments from [train.optimizer_args]: leave momentum out")


@dataclass(frozen=True, kw_only=True)
class UseCase:
    """A model and a data set: one row of the paper's tables."""

    __pydantic_config__ = WRITTEN

    name: str
    """The use case's name: it goes into run folder names and the report's rows."""
    description: str = ""
    """One line on what it is, for you (not used in training)."""
    classes: tuple[str, ...] | None = None
    """The class names, in label order (default: the synthetic set's, or a folder's class
    folders, sorted as ImageFolder sorts them: ``with_classes``)."""
    model: ModelSpec
    data: DataSpec
    train: TrainSpec = field(default_factory=TrainSpec)
    source: str = ""
    """Where the use case was read from."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not PLAIN_NAME.fullmatch(self.name):
            raise ConfigError("name", f"{self.name!r}: a use case's name goes into run folder "
                              "names; use letters, digits, '.', '_' or '-' (at most 64, "
                              "starting with a letter or digit)")
        if not isinstance(self.description, str):
            raise ConfigError("description", f"must be text, got {self.description!r}")
        if self.classes is None and self.data.synthetic:
            object.__setattr__(self, "classes", SYNTHETIC_CLASSES)
        if self.classes is not None:
            self._check_classes()

    def _check_classes(self) -> None:
        if not isinstance(self.classes, list | tuple):
            raise ConfigError("classes", f"give a list of class names (their folders' "
                              f"names), got {self.classes!r}")
        bad = next((c for c in self.classes if not _class_name(c)), None)
        if bad is not None or not all(isinstance(c, str) for c in self.classes):
            raise ConfigError("classes", f"{str(bad)[:80]!r} is not a class folder's name: "
                              f"one path component, not hidden, at most 255 characters, no "
                              f"control characters")
        classes = tuple(self.classes)
        object.__setattr__(self, "classes", classes)
        if len(classes) < 2 or len(set(classes)) != len(classes):
            raise ConfigError("classes", f"need at least two distinct names, got {list(classes)}")
        if self.data.synthetic and set(classes) != set(SYNTHETIC_CLASSES):
            raise ConfigError("classes", f"{list(classes)}: the synthetic set draws only "
                              f"{', '.join(SYNTHETIC_CLASSES)}; leave classes out, or train "
                              "on your own images with [data] dir = \"FOLDER\" (one folder "
                              "per class)")
        if self.data.synthetic and self.data.images < len(classes) * 2:
            raise ConfigError("data.images", f"need at least 2 images per class "
                              f"({2 * len(classes)}), got {self.data.images}")


def _class_name(name: Any) -> bool:
    """A class is named by its folder: one visible path component, no control characters."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and "/" not in name and
            not name.startswith(".") and name.isprintable())
