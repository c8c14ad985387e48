"""Write a use case's synthetic data set as an ImageFolder tree with a sha256 list.

The tree is built in a hidden temporary folder beside the target and moved into place
only when complete, so an interrupted generation never leaves a half data set that looks
whole. ``--shard i/n`` makes only the images whose index is i modulo n (into a folder of
its own), for generating on several machines; shards are byte-identical to the full set.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ddlstudy.config import DataSpec
from ddlstudy.data.fingerprint import SUMS_FILE, fingerprint, sha256_file, write_sums
from ddlstudy.data.synthetic import CLASSES, render_image
from ddlstudy.errors import UsageError
from ddlstudy.files import WriteFailed, full
from ddlstudy.progress import progress
from ddlstudy.reading import check_regular, read_json

SPEC_FILE = "dataset.json"
GENERATOR_VERSION = 1
JPEG_QUALITY = 92


def per_class_counts(total: int, n_classes: int = len(CLASSES)) -> list[int]:
    """Split ``total`` images as evenly as possible, the first classes taking the remainder."""
    base, extra = divmod(total, n_classes)
    return [base + (i < extra) for i in range(n_classes)]


def image_name(cls: str, index: int) -> str:
    return f"{cls}_{index:05d}.jpg"


def _spec_record(spec: DataSpec, shard: tuple[int, int] | None) -> dict:
    return {"generator_version": GENERATOR_VERSION, "name": spec.name, "images": spec.images,
            "source_size": spec.source_size, "seed": spec.seed, "difficulty": spec.difficulty,
            "label_noise": spec.label_noise, "classes": list(CLASSES),
            "shard": list(shard) if shard else None}


def is_complete(root: Path, spec: DataSpec, shard: tuple[int, int] | None = None) -> bool:
    """True when ``root`` holds exactly this spec's data set (its record and sha256 list)."""
    try:
        record = read_json(root / SPEC_FILE, "data set record")
    except UsageError:
        return False
    return record == _spec_record(spec, shard) and (root / SUMS_FILE).is_file()


def refuse_another_spec(root: Path, spec: DataSpec, shard: tuple[int, int] | None) -> None:
    """A data set of the same name made with other settings belongs to another use case
    (or an earlier version of this one), and one whose record or sums cannot be read may
    hold someone's files: never replace either silently."""
    if not (root / SPEC_FILE).exists() and not (root / SPEC_FILE).is_symlink():
        return
    again = f"; regenerate it with `ddlstudy dataset make --usecase ... --force`, or move " \
            f"{root} away"
    try:
        record = read_json(root / SPEC_FILE, "data set record")
        check_regular(root / SUMS_FILE, "data set checksums")  # ddlstudy writes both
    except UsageError as exc:
        raise UsageError(f"{str(exc).removesuffix('; give the path of a file')}{again}") from None
    wanted = _spec_record(spec, shard)
    if not isinstance(record, dict):
        raise UsageError(f"data set record {root / SPEC_FILE}: is not a JSON object{again}")
    if record == wanted:
        return
    changed = [f"{k} {record.get(k)!r} there, {v!r} here" for k, v in wanted.items()
               if record.get(k) != v]
    raise UsageError(f"{root} holds a data set of the same name made with other settings "
                     f"({'; '.join(changed[:3])}); give this use case its own data.name, "
                     f"or replace it with `ddlstudy dataset make --usecase ... --force`")


def _render_one(job: tuple[Path, int, int, DataSpec]) -> tuple[str, str]:
    folder, class_id, index, spec = job
    cls = CLASSES[class_id]
    path = folder / cls / image_name(cls, index)
    img = render_image(spec.seed, class_id, index, spec.source_size, spec.difficulty,
                       spec.label_noise)
    img.save(path, format="JPEG", quality=JPEG_QUALITY)
    return f"{cls}/{path.name}", sha256_file(path)


def make_dataset(spec: DataSpec, root: Path, *, shard: tuple[int, int] | None = None,
                 workers: int | None = None, force: bool = False,
                 expect: Callable[[str], None] | None = None) -> Path:
    """Generate ``spec`` under ``root`` (skipped when already complete); returns ``root``.
    ``expect`` is given the new set's fingerprint before it is put in place: where it
    refuses (a replay of other data), nothing is left under ``root``'s folder."""
    if is_complete(root, spec, shard) and not force:
        return root
    if not force:
        refuse_another_spec(root, spec, shard)
    if root.exists() and not (root / SPEC_FILE).is_file():
        raise UsageError(f"{root} exists but was not written by ddlstudy; move it away or "
                         "choose another data.name")
    shard_i, shard_n = shard or (0, 1)
    if not 0 <= shard_i < shard_n:
        raise UsageError(f"--shard {shard_i}/{shard_n}: need 0 <= i < n")
    made_parent = not root.parent.exists()
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for cls in CLASSES:
        (tmp / cls).mkdir(parents=True)
    jobs = [(tmp, c, i, spec)
            for c, count in enumerate(per_class_counts(spec.images))
            for i in range(count) if i % shard_n == shard_i]
    workers = workers or max(1, min(len(os.sched_getaffinity(0)), 8))
    sums: list[tuple[str, str]] = []
    try:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = pool.map(_render_one, jobs, chunksize=16)
            for item in progress(results, total=len(jobs), desc=f"generating {spec.name}",
                                 unit="img"):
                sums.append(item)
        write_sums(tmp, sums)
        if expect is not None:
            expect(fingerprint(sums))
        (tmp / SPEC_FILE).write_text(json.dumps(_spec_record(spec, shard), indent=2) + "\n")
        old = root.parent / f".{root.name}.old-{os.getpid()}"
        if root.exists():
            os.replace(root, old)  # the old set stays whole until the new one is in place
        os.replace(tmp, root)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if made_parent and not any(root.parent.iterdir()):
            root.parent.rmdir()
        cause = exc.error if isinstance(exc, WriteFailed) else exc
        if full(cause):  # a worker's too: its OSError comes back whole
            raise UsageError(f"{root}: the disk is full ({cause.strerror}) after "
                             f"{len(sums)} of {len(jobs)} images; nothing of the set is left "
                             f"there: free some space, then run it again") from None
        raise
    return root
