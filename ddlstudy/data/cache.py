"""Each image of a data set decoded, resized and cropped once, into one uint8 file per
(data set fingerprint, image size) that every process and rank on the host maps.

A batch is then one index into the file, a flip and a normalise as tensor operations
(``data.images.CachedImages``): the same tensors, bit for bit, and the same random draws
as decoding every image in the loop, without the decode and the resize, which took a fifth
of the images/s of a 2-core machine whose cores all train.

The file lives in ``$DDLSTUDY_CACHE`` (default ``$XDG_CACHE_HOME/ddlstudy``, else
``~/.cache/ddlstudy``), on the host's own disk rather than in the data set, which may be
read-only or shared between hosts. It is written once, under a lock (the first process
builds it, the others wait and map it), through temporary files renamed into place, the
index last: a half-written cache is never read. Where it cannot be written (no space, no
permission) the run decodes in the loop and says why.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ddlstudy.config.paths import CACHE_ENV, cache_dir
from ddlstudy.errors import UsageError
from ddlstudy.files import atomic_write_text
from ddlstudy.reading import read_json

log = logging.getLogger("ddlstudy")

VERSION = 1
SPARE_BYTES = 512 << 20
"""Free space a cache leaves on its disk: a cache never fills the disk runs write to."""


@dataclass(frozen=True)
class Decoded:
    """The cache of one data set at one size: ``rows[relative path]`` is the row of that
    image in ``file``, an array of shape (images, size, size, 3), uint8 RGB."""

    file: Path
    rows: dict[str, int]
    size: int

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return len(self.rows), self.size, self.size, 3

    def array(self) -> np.ndarray:
        return np.memmap(self.file, np.uint8, "r", shape=self.shape)


def resized(path: Path, size: int) -> np.ndarray:
    """The image as a network sees it before ``data.images.Preprocess``: torchvision's own
    Resize (the shorter side) and CenterCrop, as HWC uint8."""
    from torchvision import transforms

    fit = transforms.Compose([transforms.Resize(size), transforms.CenterCrop(size)])
    with Image.open(path) as img:
        return np.asarray(fit(img.convert("RGB")))


def _complete(index: Path, file: Path, rels: list[str], size: int) -> Decoded | None:
    try:
        meta = read_json(index, "cache index")
        decoded = Decoded(file, {rel: i for i, rel in enumerate(meta["rows"])}, meta["size"])
    except (UsageError, KeyError, TypeError, AttributeError):
        return None
    if meta.get("version") != VERSION or meta["rows"] != rels or decoded.size != size:
        return None
    try:
        if file.stat().st_size != int(np.prod(decoded.shape)):
            return None
    except OSError:
        return None
    return decoded


class _Unreadable(Exception):
    """An image of the set could not be decoded while the cache was built."""


def _fill(out: np.ndarray, root: Path, rels: list[str], size: int, threads: int) -> None:
    def one(i: int) -> None:
        try:
            out[i] = resized(root / rels[i], size)
        except (OSError, ValueError) as exc:
            raise _Unreadable(f"{root / rels[i]} could not be decoded ({exc})") from exc

    with ThreadPoolExecutor(threads) as pool:  # Pillow releases the GIL while decoding
        list(pool.map(one, range(len(rels))))


def _build(root: Path, rels: list[str], size: int, file: Path, threads: int) -> None:
    tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
    try:
        out = np.memmap(tmp, np.uint8, "w+", shape=(len(rels), size, size, 3))
        _fill(out, root, rels, size, threads)
        out.flush()
        del out
        os.replace(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)


def _lock(path: Path):
    """The lock file, opened without waiting (a FIFO put there would block an ``open``);
    one that is not a regular file is an OSError: the cache is not used."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO with no reader
            raise OSError(0, f"{path} is a FIFO, not a regular file; remove it") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(0, f"{path} is not a regular file; remove it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "w")


def decoded(root: Path, rels: list[str], fingerprint: str, size: int,
            threads: int | None = None) -> tuple[Decoded | None, str]:
    """The cache of the images ``rels`` under ``root`` (the data set whose fingerprint is
    ``fingerprint``) at ``size`` px, built if this host has none yet; (None, why) where it
    cannot be."""
    folder = cache_dir()
    name = f"{fingerprint[:32]}-{size}px-v{VERSION}"
    file, index = folder / f"{name}.u8", folder / f"{name}.json"
    found = _complete(index, file, rels, size)
    if found is not None:
        return found, ""
    need = len(rels) * size * size * 3
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _lock(folder / f"{name}.lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds, the others wait for it
            found = _complete(index, file, rels, size)
            if found is not None:
                return found, ""
            free = shutil.disk_usage(folder).free
            if free < need + SPARE_BYTES:
                return None, (f"{folder} has {free / 2**20:.0f} MiB free and the decoded "
                              f"images need {need / 2**20:.0f} MiB (plus "
                              f"{SPARE_BYTES >> 20} MiB to spare); free some, or point "
                              f"{CACHE_ENV} at a larger disk")
            started = time.perf_counter()
            threads = threads or min(8, os.cpu_count() or 1)
            _build(root, rels, size, file, threads)
            atomic_write_text(index, json.dumps({"version": VERSION, "size": size,
                                                 "fingerprint": fingerprint, "root": str(root),
                                                 "rows": rels}))
            log.info("decoded %d images at %d px once into %s (%.1f s, %.0f MiB)", len(rels),
                     size, file, time.perf_counter() - started, need / 2**20)
    except _Unreadable as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"{folder}: {exc.strerror or exc}; set {CACHE_ENV} to a writable folder"
    found = _complete(index, file, rels, size)
    return found, "" if found else f"{index} did not read back as written"


def channel_stats(root: Path, rels: list[str], fingerprint: str, size: int,
                  cached: bool = True) -> dict:
    """The data set's own mean and standard deviation per RGB channel, of its images at
    ``size`` px as a network sees them (values / 255), computed once per data set
    (``fingerprint``) and size and kept in this host's cache (``cached``: through the
    decoded images where they can be cached, else decoded here)."""
    folder = cache_dir()
    file = folder / f"{fingerprint[:32]}-{size}px-stats.json"
    try:
        known = json.loads(file.read_text())
        if known.get("fingerprint") == fingerprint and known.get("size") == size:
            return known
    except (OSError, ValueError, AttributeError):
        pass
    found = decoded(root, rels, fingerprint, size)[0] if cached else None
    sums, squares, pixels = np.zeros(3), np.zeros(3), 0
    for start in range(0, len(rels), 256):  # a chunk at a time: bounded memory
        chunk = found.array()[start:start + 256] if found is not None else np.stack(
            [resized(root / rel, size) for rel in rels[start:start + 256]])
        values = chunk.reshape(-1, 3).astype(np.float64) / 255
        sums, squares = sums + values.sum(0), squares + (values ** 2).sum(0)
        pixels += len(values)
    mean = sums / pixels
    std = np.sqrt(np.maximum(squares / pixels - mean ** 2, 1e-12))
    stats = {"fingerprint": fingerprint, "size": size, "images": len(rels),
             "mean": [round(float(m), 6) for m in mean],
             "std": [round(float(s), 6) for s in std]}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(file, json.dumps(stats))
    except OSError as exc:
        log.warning("the data set's mean and std are not kept (%s): computed again next run",
                    exc.strerror or exc)
    return stats
