"""Data: the synthetic generator, the ImageFolder reader and the split a run trains on."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from ddlstudy.config import RunConfig
from ddlstudy.data.cache import channel_stats
from ddlstudy.data.fingerprint import SUMS_FILE, sha256_bytes
from ddlstudy.data.folder import (
    ImageList,
    class_sizes,
    scan_imagefolder,
    stratified_split,
    val_count,
)
from ddlstudy.data.generate import (
    is_complete,
    make_dataset,
    per_class_counts,
    refuse_another_spec,
)
from ddlstudy.errors import DataError
from ddlstudy.files import check_folder
from ddlstudy.reading import CAPS, read_bytes

log = logging.getLogger("ddlstudy")


@dataclass(frozen=True)
class DataPlan:
    """What a run trains and validates on, decided once before training starts."""

    images: ImageList
    train: list[tuple[str, int]]
    val: list[tuple[str, int]]
    source: str
    """'synthetic' or 'imagefolder'."""
    sums_file_sha256: str | None = None
    """The sha256 of the set's SHA256SUMS file, where it has one (synthetic sets do)."""
    stats: dict | None = None
    """Its own mean and std per channel, where ``data.normalize`` is ``dataset``."""

    def to_message(self) -> dict:
        """Everything, as JSON-able values (node 0 sends the plan to the other nodes)."""
        i = self.images
        return {"images": {"root": str(i.root), "classes": list(i.classes),
                           "items": i.items, "skipped": i.skipped,
                           "fingerprint": i.fingerprint, "per_class": i.per_class},
                "train": self.train, "val": self.val, "source": self.source,
                "sums_file_sha256": self.sums_file_sha256, "stats": self.stats}

    @classmethod
    def from_message(cls, m: dict) -> DataPlan:
        """The plan ``to_message`` described, equal to the sender's."""
        i = m["images"]
        images = ImageList(root=Path(i["root"]), classes=tuple(i["classes"]),
                           items=tuple(_pairs(i["items"])),
                           skipped=tuple(_pairs(i["skipped"])),
                           fingerprint=i["fingerprint"], per_class=dict(i["per_class"]))
        return cls(images=images, train=_pairs(m["train"]), val=_pairs(m["val"]),
                   source=m["source"], sums_file_sha256=m["sums_file_sha256"],
                   stats=m.get("stats"))

    def describe(self) -> dict:
        return {
            "source": self.source,
            "root": str(self.images.root),
            "fingerprint": self.images.fingerprint,
            "sums_file_sha256": self.sums_file_sha256,
            "images": len(self.images.items),
            "per_class": self.images.per_class,
            "train_images": len(self.train),
            "val_images": len(self.val),
            "skipped": [{"file": f, "reason": r} for f, r in self.images.skipped],
            **({"stats": self.stats} if self.stats else {}),
        }


def _pairs(rows: list) -> list[tuple]:
    """JSON's lists back into the (name, label) or (name, reason) tuples they were."""
    return [tuple(row) for row in rows]


def dataset_root(cfg: RunConfig) -> Path:
    """The folder a run reads: --data-dir, the use case's own folder, or its synthetic set
    under --datasets-dir."""
    folder = cfg.data_dir or cfg.usecase.data.dir
    return Path(folder) if folder else Path(cfg.datasets_dir) / cfg.usecase.data.name


def planned_train_images(cfg: RunConfig) -> int | None:
    """How many images the run will train on, known before its data is prepared (no image
    read): a synthetic set's from its spec, a folder's from its class folders' listing,
    split as ``stratified_split`` splits them; None where they cannot be listed (preparing
    the data says why). Unreadable images a scan skips make a folder's fewer."""
    uc = cfg.usecase
    if cfg.data_dir or uc.data.dir:
        try:
            sizes = class_sizes(dataset_root(cfg), uc.classes or ())
        except (OSError, DataError):
            return None
    else:
        sizes = per_class_counts(uc.data.images, len(uc.classes))
    return sum(n - val_count(n, uc.train.val_fraction) for n in sizes if n >= 2) or None


def planned_steps(cfg: RunConfig) -> int | None:
    """The optimizer steps of each of the run's epochs (``Trainer.steps_per_epoch``: one a
    global batch, the last one short, at most --max-steps), known before its data is
    prepared; None where its images cannot be counted yet."""
    images = planned_train_images(cfg)
    if images is None:
        return None
    steps = math.ceil(images / cfg.global_batch)
    return min(steps, cfg.max_steps) if cfg.max_steps else steps


def _same_data(cfg: RunConfig, root: Path, got: str) -> None:
    """Refuse data whose fingerprint is not the one of the run being replayed."""
    if cfg.expect_fingerprint and got != cfg.expect_fingerprint:
        raise DataError(f"the data in {root} has fingerprint {got[:16]}... but the run being "
                        f"replayed used {cfg.expect_fingerprint[:16]}...: the images changed; "
                        "regenerate them (ddlstudy dataset make --force) or give the original "
                        "data with --data-dir")


def prepare_data(cfg: RunConfig) -> DataPlan:
    """Generate the synthetic set if it is missing, then scan, check and split the tree."""
    uc = cfg.usecase
    root = dataset_root(cfg)
    source = "imagefolder" if cfg.data_dir or cfg.usecase.data.dir else "synthetic"
    if source == "synthetic" and not is_complete(root, uc.data):
        refuse_another_spec(root, uc.data, None)
        check_folder("--datasets-dir", root)  # a set on a read-only mount: said, not OSError
        log.info("synthetic data set %s is missing: generating %d images in %s",
                 uc.data.name, uc.data.images, root)
        make_dataset(uc.data, root, expect=lambda got: _same_data(cfg, root, got))
    images = scan_imagefolder(root, uc.classes, cfg.on_bad_image)
    sums = root / SUMS_FILE
    sums_sha = sha256_bytes(read_bytes(sums, SUMS_FILE, CAPS["record"])) \
        if sums.is_file() else None  # unreadable (permissions): one line, not OSError
    if sums_sha and sums_sha != images.fingerprint:
        log.warning("%s no longer matches its %s: files were changed, added or removed",
                    root, SUMS_FILE)
    _same_data(cfg, root, images.fingerprint)
    if images.skipped:
        log.warning("skipping %d unreadable images (listed in the manifest), first: %s",
                    len(images.skipped), images.skipped[0][0])
    few = {c: n for c, n in images.per_class.items() if n < 2}
    if few:
        raise DataError(f"{root} holds too few images of {', '.join(sorted(few))} "
                        f"({', '.join(map(str, few.values()))}); a run needs at least 2 a "
                        f"class, one to train on and one to validate")
    train, val = stratified_split(images.items, uc.train.val_fraction, uc.train.seed,
                                  len(uc.classes))
    stats = None
    if uc.data.normalize == "dataset":
        stats = channel_stats(root, [rel for rel, _ in images.items], images.fingerprint,
                              uc.train.image_size, cfg.data_cache)
    return DataPlan(images=images, train=train, val=val, source=source,
                    sums_file_sha256=sums_sha, stats=stats)

