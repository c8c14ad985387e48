"""Read any ImageFolder tree (root/<class>/<image>) safely and split it (torch-free: a
refusal answers before torch is imported; ``data.images`` loads the images for training).

torchvision's ImageFolder takes hidden folders for classes and judges files by extension
only, so the tree is scanned and every image decoded here, before training: class folders
are checked against the use case, hidden files and folders are ignored, and an unreadable
image either stops the run naming the file (``fail``) or is skipped and listed (``skip``).
The scan is sorted, so every rank of a distributed job gets the same list.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import PIL
from PIL import Image, ImageFile

from ddlstudy.config import BadImagePolicy
from ddlstudy.data.cache import cache_dir
from ddlstudy.data.fingerprint import fingerprint, sha256_bytes
from ddlstudy.errors import DataError, UsageError
from ddlstudy.files import WriteFailed, atomic_write_text
from ddlstudy.reading import CAPS, MiB, read_bytes, read_json

IMAGE_CAP = 512 * MiB

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm"}
ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is a bad image, not a grey one


@dataclass(frozen=True)
class ImageList:
    """The images of a tree that will be used: (relative path, label) pairs, sorted."""

    root: Path
    classes: tuple[str, ...]
    items: tuple[tuple[str, int], ...]
    skipped: tuple[tuple[str, str], ...] = ()
    """(relative path, reason) of the images left out under ``--on-bad-image skip``."""
    fingerprint: str = ""
    per_class: dict[str, int] = field(default_factory=dict)


def _visible(path: Path) -> bool:
    return not path.name.startswith(".")


def _class_folders(root: Path, classes: tuple[str, ...]) -> None:
    if not root.exists():
        raise DataError(f"data folder {root} does not exist")
    if not root.is_dir():
        raise DataError(f"data folder {root} is not a folder")
    try:
        found = {p.name for p in root.iterdir() if p.is_dir() and _visible(p)}
    except OSError as exc:
        _unreadable(exc)
    if not found:
        raise DataError(f"data folder {root} has no class folders; expected one folder per "
                        f"class: {', '.join(classes)}")
    for name in classes:
        if name in found:
            continue
        near = [f for f in found if f.lower() == name.lower()]
        hint = (f"found {near[0]!r} instead: class names are case-sensitive, rename it to "
                f"{name!r}" if near else f"its class folders are {', '.join(sorted(found))}: "
                f"give a use case that lists those classes, or none (its classes are then "
                f"its folders: `ddlstudy usecase new --data-dir {root}`, or `ddlstudy run "
                f"--data-dir {root} --model NAME` without --usecase)")
        raise DataError(f"class folder {name!r} is missing in {root}; {hint}")
    extra = sorted(found - set(classes))
    if extra:
        raise DataError(f"{root} has folder {extra[0]!r}, which is not a class of this use case "
                        f"({', '.join(classes)}); move it out or add it to the use case's classes")


def _utf8(name: str) -> bool:
    try:
        name.encode()
        return True
    except UnicodeEncodeError:  # a byte that is not UTF-8, kept by Python as a surrogate
        return False


def _unreadable(exc: OSError) -> None:
    """A folder of the tree that cannot be listed (no permission): said, not taken for
    an empty one."""
    raise DataError(f"folder {exc.filename} cannot be read ({exc.strerror}); give this user "
                    f"permission to read it (chmod u+rx), or move it out of the data folder")


def _image_files(folder: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(folder, onerror=_unreadable):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in [*dirnames, *filenames]:
            if not _utf8(name):
                raise DataError(f"{ascii(os.path.join(dirpath, name))}: its name is not UTF-8 "
                                "text, which ddlstudy cannot record; rename it")
        files += [Path(dirpath, f) for f in filenames
                  if not f.startswith(".") and os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS]
    return sorted(files, key=lambda p: p.parts)  # Path's own order, without its __lt__


def _check_image(path: Path, decode: bool = True) -> tuple[str | None, str]:
    """(sha256, '') for a readable image, (None, reason) otherwise; without ``decode``,
    for a file that can be read, whether or not it decodes."""
    try:
        data = read_bytes(path, "image", cap=IMAGE_CAP)
        if not data:
            return None, "empty file"
        if decode:
            with Image.open(io.BytesIO(data)) as img:
                img.load()
        return sha256_bytes(data), ""
    except UsageError as exc:  # not a regular file, too large
        return None, str(exc).split(": ", 1)[-1]
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        said = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", "the file", str(exc))
        return None, f"{type(exc).__name__}: {said}"


def _checked_file(rels: list[str], digests: list[tuple[str | None, str]]) -> Path | None:
    """Where the outcome of decoding exactly these files (by content) with this Pillow is
    kept, so that the next scan of the same tree only reads and hashes them; None where a
    file cannot even be read."""
    if any(digest is None for digest, _ in digests):
        return None
    key = fingerprint((rel, d) for rel, (d, _) in zip(rels, digests, strict=True))
    return cache_dir() / "checked" / "images" / f"{key[:32]}-pillow{PIL.__version__}.json"


def _each(pool: ThreadPoolExecutor, threads: int, files: list[tuple[Path, int]],
          decode: bool) -> list[tuple[str | None, str]]:
    """``_check_image`` of every file, in order, the files cut into one run of files a
    thread (a task a file cost more in the pool than hashing it: 6,003 images took 1 s)."""
    size = max(1, -(-len(files) // threads))
    runs = pool.map(lambda run: [_check_image(path, decode) for path, _ in run],
                    [files[i:i + size] for i in range(0, len(files), size)])
    return [found for run in runs for found in run]


Stat = tuple[int, int, int, int]
"""A file's size, modification and change times (ns) and inode: git's test of a file
unchanged (the change time cannot be set back, as the modification time can)."""


def _stat(path: Path) -> Stat | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


SETTLED_NS = 2 * 10**9
"""A file is kept by its ``Stat`` only once its times are this old: one written within the
clock's tick of its stat could change again with the same ``Stat`` (git's racy files)."""


def _digests_file(root: Path) -> Path:
    """Where the digests of ``root``'s files on this machine are kept, by their ``Stat``
    (a cache shared over NFS by machines with their own copies at one path: one each)."""
    key = sha256_bytes(f"{socket.gethostname()}:{root}".encode())[:32]
    return cache_dir() / "checked" / "digests" / f"{key}.json"


def _kept(entry: object, st: Stat | None) -> tuple[str | None, str] | None:
    """A kept entry's digest where it is one and its ``Stat`` is ``st``."""
    if isinstance(entry, list) and len(entry) == 5 and tuple(entry[:4]) == st and \
            isinstance(entry[4], str) and len(entry[4]) == 64:
        return entry[4], ""
    return None


def _hashed(pool: ThreadPoolExecutor, threads: int, root: Path, files: list[tuple[Path, int]],
            rels: list[str]) -> list[tuple[str | None, str]]:
    """``_each`` without decoding, but a file whose ``Stat`` is as when it was last hashed
    keeps that digest, not read again: simple-big's 6,003 images (65 MB) in 0.26-0.32 s,
    their stats in 0.03 s; every run's start, every MPI rank's. A file that cannot be
    read is never kept, so it is read again, and said."""
    settled = time.time_ns() - SETTLED_NS
    memo, stats = _digests_file(root.resolve()), [_stat(p) for p, _ in files]
    try:
        kept = read_json(memo, "digests memo")
    except UsageError:
        kept = None
    kept = kept if isinstance(kept, dict) else {}
    found = [_kept(kept.get(rel), st) for rel, st in zip(rels, stats, strict=True)]
    todo = [i for i, f in enumerate(found) if f is None]
    for i, f in zip(todo, _each(pool, threads, [files[i] for i in todo], decode=False),
                    strict=True):
        found[i] = f
    if any(found[i][0] is not None for i in todo):  # something new to keep
        text = json.dumps({rel: [*st, d] for rel, st, (d, _) in zip(
            rels, stats, found, strict=True) if st is not None and d is not None
            and max(st[1], st[2]) < settled})
        if len(text) < CAPS["record"]:  # what read_json reads back
            _remember_text(memo, text)
    return found


def _checks(root: Path, files: list[tuple[Path, int]], rels: list[str], threads: int
            ) -> tuple[list[tuple[str | None, str]], Path | None]:
    """Every file's (sha256, '') or (None, why it is not a usable image), and where to
    remember the outcome once the scan has accepted the tree (None: it is remembered
    already, or a file cannot even be read). Each file is decoded once per content: a scan
    of a tree already checked only hashes it (``_hashed``: what changed). ``rels``: the
    files' relative paths."""
    with ThreadPoolExecutor(threads) as pool:  # Pillow releases the GIL while decoding
        digests = _hashed(pool, threads, root, files, rels)
        memo = _checked_file(rels, digests)
        try:
            bad = read_json(memo, "checked-images memo") if memo is not None else None
        except UsageError:
            bad = None
        if isinstance(bad, dict):
            return [(None, bad[rel]) if rel in bad else found
                    for rel, found in zip(rels, digests, strict=True)], None
        return _each(pool, threads, files, decode=True), memo


def _remember(memo: Path, bad: dict[str, str]) -> None:
    """Keep the outcome of a scan that accepted its tree (``bad``: the images it left
    out, by relative path); a refused scan writes nothing."""
    _remember_text(memo, json.dumps(bad))


def _remember_text(memo: Path, text: str) -> None:
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(memo, text)
    except (OSError, WriteFailed):  # a full disk or quota too
        pass  # the next scan reads (or decodes) again


def scan_imagefolder(root: Path, classes: tuple[str, ...],
                     policy: BadImagePolicy = BadImagePolicy.FAIL,
                     threads: int | None = None) -> ImageList:
    """Check and list the tree; every image is decoded (in threads, once per content) to
    catch bad files."""
    root = Path(root)
    _class_folders(root, classes)
    files: list[tuple[Path, int]] = []
    for label, name in enumerate(classes):
        found = _image_files(root / name)
        if not found:
            raise DataError(f"class folder {root / name} holds no images (looked for "
                            f"{', '.join(sorted(IMAGE_EXTENSIONS))})")
        files += [(p, label) for p in found]
    rels = [path.relative_to(root).as_posix() for path, _ in files]
    checks, memo = _checks(root, files, rels, threads or min(8, (os.cpu_count() or 1) * 2))
    items, skipped, sums = [], [], []
    for (path, label), rel, (digest, reason) in zip(files, rels, checks, strict=True):
        if digest is None:
            if policy is BadImagePolicy.FAIL:
                raise DataError(f"unreadable image {path} ({reason}); remove or replace it, or "
                                "pass --on-bad-image skip to train without it")
            skipped.append((rel, reason))
            continue
        items.append((rel, label))
        sums.append((rel, digest))
    per_class = {name: sum(1 for _, lab in items if lab == i) for i, name in enumerate(classes)}
    empty = [name for name, n in per_class.items() if n == 0]
    if empty:
        raise DataError(f"class {empty[0]!r} has no readable image left in {root}")
    if memo is not None:  # only now: nothing is written before a refusal
        _remember(memo, dict(skipped))
    return ImageList(root=root, classes=classes, items=tuple(items), skipped=tuple(skipped),
                     fingerprint=fingerprint(sums), per_class=per_class)


def class_sizes(root: Path, classes: tuple[str, ...]) -> list[int]:
    """The image files of each class folder of ``root``, listed, not decoded (what a
    scan finds, less the unreadable images it skips); OSError or DataError where they
    cannot be listed."""
    return [len(_image_files(Path(root) / name)) for name in classes]


def val_count(n: int, val_fraction: float) -> int:
    """How many of a class's ``n`` images validate: its share, at least one, and one
    left to train on."""
    return min(n - 1, max(1, round(n * val_fraction)))


def stratified_split(items: tuple[tuple[str, int], ...], val_fraction: float, seed: int,
                     n_classes: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Seeded per-class split: each class keeps its share in both halves."""
    train, val = [], []
    for label in range(n_classes):
        members = [it for it in items if it[1] == label]
        order = np.random.default_rng([seed, label]).permutation(len(members))
        n_val = val_count(len(members), val_fraction)
        val += [members[i] for i in order[:n_val]]
        train += [members[i] for i in order[n_val:]]
    return sorted(train), sorted(val)
