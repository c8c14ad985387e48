import dataclasses
import hashlib
import json

import numpy as np
import pytest

from ddlstudy.config import BadImagePolicy
from ddlstudy.data.fingerprint import SUMS_FILE, sha256_file
from ddlstudy.data.folder import scan_imagefolder, stratified_split
from ddlstudy.data.generate import is_complete, make_dataset, per_class_counts
from ddlstudy.data.synthetic import render_image
from ddlstudy.errors import DataError

CLASSES = ("fire", "smoke", "nofire")


def test_images_are_deterministic_and_distinct():
    a = np.asarray(render_image(1, 0, 5, 64, 0.5, 0.0))
    b = np.asarray(render_image(1, 0, 5, 64, 0.5, 0.0))
    c = np.asarray(render_image(1, 0, 6, 64, 0.5, 0.0))
    d = np.asarray(render_image(2, 0, 5, 64, 0.5, 0.0))
    assert a.shape == (64, 64, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c) and not np.array_equal(a, d)


def test_fire_is_redder_than_no_fire_on_average():
    """The classes differ in the way the recipe says: flames add red-orange light."""
    def red_excess(class_id):
        imgs = [np.asarray(render_image(3, class_id, i, 64, 0.0, 0.0), np.float32)
                for i in range(40)]
        return np.mean([(im[..., 0] - im[..., 2]).clip(0).mean() for im in imgs])

    assert red_excess(0) > red_excess(2) * 1.2


def test_per_class_counts():
    assert per_class_counts(6003) == [2001, 2001, 2001]
    assert per_class_counts(791) == [264, 264, 263]


def test_sharded_generation_is_byte_identical(tmp_path, tiny):
    spec = dataclasses.replace(tiny.data, images=30, name="s")
    full = make_dataset(spec, tmp_path / "full", workers=2)
    shards = [make_dataset(spec, tmp_path / f"shard{i}", shard=(i, 2), workers=1)
              for i in range(2)]
    full_files = {p.relative_to(full).as_posix(): sha256_file(p) for p in full.rglob("*.jpg")}
    shard_files = {p.relative_to(s).as_posix(): sha256_file(p)
                   for s in shards for p in s.rglob("*.jpg")}
    assert len(full_files) == 30
    assert shard_files == full_files
    lines = (full / SUMS_FILE).read_text().splitlines()
    assert len(lines) == 30
    digest, rel = lines[0].split("  ")
    assert sha256_file(full / rel) == digest
    assert is_complete(full, spec) and not is_complete(full, dataclasses.replace(spec, seed=9))
    assert not list(tmp_path.glob(".*partial*"))  # no temporary folder left behind


def test_generation_refuses_a_foreign_folder(tmp_path, tiny):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("my data")
    with pytest.raises(DataError.__mro__[1], match="not written by ddlstudy"):
        make_dataset(tiny.data, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "my data"


def test_scan_lists_every_image_with_its_label(datasets_dir, tiny):
    root = datasets_dir / tiny.data.name
    images = scan_imagefolder(root, CLASSES)
    assert len(images.items) == tiny.data.images
    assert images.per_class == dict(zip(CLASSES, per_class_counts(tiny.data.images),
                                        strict=True))
    assert all(rel.split("/")[0] == CLASSES[label] for rel, label in images.items)
    assert images.fingerprint == hashlib.sha256((root / SUMS_FILE).read_bytes()).hexdigest()


def test_hidden_files_and_folders_are_ignored(imagefolder):
    (imagefolder / ".ipynb_checkpoints").mkdir()
    (imagefolder / "fire" / ".DS_Store").write_bytes(b"\0\1junk")
    (imagefolder / "fire" / ".hidden.jpg").write_bytes(b"not an image")
    before = scan_imagefolder(imagefolder, CLASSES)
    assert all(not rel.split("/")[-1].startswith(".") for rel, _ in before.items)
    assert len(before.items) == 300


@pytest.mark.parametrize("damage, message", [
    (lambda r: (r / "fire").rename(r / "Fire"), "found 'Fire' instead"),
    (lambda r: (r / "extra").mkdir(), "'extra', which is not a class"),
    (lambda r: [p.unlink() for p in (r / "smoke").iterdir()], "holds no images"),
    (lambda r: [__import__("shutil").rmtree(r / c) for c in CLASSES], "has no class folders"),
])
def test_folder_mistakes_are_clear_errors(imagefolder, damage, message):
    damage(imagefolder)
    with pytest.raises(DataError, match=message):
        scan_imagefolder(imagefolder, CLASSES)


def test_missing_root_is_an_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        scan_imagefolder(tmp_path / "nope", CLASSES)


def _corrupt(root):
    first = sorted((root / "smoke").iterdir())[0]
    sorted((root / "smoke").iterdir())[1].write_bytes(b"")  # zero bytes
    data = first.read_bytes()
    first.write_bytes(data[: len(data) // 2])  # truncated
    (root / "nofire" / "garbage.png").write_bytes(b"\x89PNG garbage" * 10)
    return first


def test_bad_image_fail_names_the_file(imagefolder):
    truncated = _corrupt(imagefolder)  # the first bad file in class order
    with pytest.raises(DataError, match=rf"unreadable image .*smoke/{truncated.name} .*truncated"):
        scan_imagefolder(imagefolder, CLASSES)


def test_bad_image_skip_lists_them(imagefolder):
    truncated = _corrupt(imagefolder)
    images = scan_imagefolder(imagefolder, CLASSES, BadImagePolicy.SKIP)
    skipped = {rel for rel, _ in images.skipped}
    assert len(images.items) == 300 - 2
    assert skipped == {"smoke/" + truncated.name, "smoke/smoke_00001.jpg", "nofire/garbage.png"}


def test_split_is_stratified_seeded_and_disjoint(datasets_dir, tiny):
    items = scan_imagefolder(datasets_dir / tiny.data.name, CLASSES).items
    train, val = stratified_split(items, 0.2, seed=0, n_classes=3)
    again, _ = stratified_split(items, 0.2, seed=0, n_classes=3)
    other, _ = stratified_split(items, 0.2, seed=1, n_classes=3)
    assert train == again and train != other
    assert not set(train) & set(val) and len(train) + len(val) == len(items)
    assert [sum(1 for _, lab in val if lab == c) for c in range(3)] == [20, 20, 20]


def _batches(cfg, n=4):
    import itertools

    from ddlstudy.data import prepare_data
    from ddlstudy.training import make_loaders, seed_everything

    seed_everything(0)
    train, val = make_loaders(cfg, prepare_data(cfg))
    return list(itertools.islice(train, n)) + list(itertools.islice(val, 2))


@pytest.mark.parametrize("size", [64, 80])  # the set's own size, and a resize
def test_the_decoded_cache_gives_the_same_batches_and_flips(quick_config, data_cache, size):
    """Batches from the cache equal torchvision's decode, resize, flip and normalise of
    each image in the loop, bit for bit, flips included (the same random draws)."""
    import torch

    from ddlstudy.config import with_overrides
    from ddlstudy.runner import resolve

    cfg = quick_config(batch_size=32)
    cfg = dataclasses.replace(cfg, usecase=with_overrides(cfg.usecase, image_size=size))
    cached = _batches(resolve(cfg))
    assert list(data_cache.glob(f"*-{size}px-v*.u8"))  # it did come from a cache
    decoded = _batches(resolve(dataclasses.replace(cfg, data_cache=False)))
    for (x, y), (x2, y2) in zip(cached, decoded, strict=True):
        assert x.shape == (len(y), 3, size, size) and x.is_contiguous()
        assert torch.equal(x, x2) and torch.equal(y, y2)
    from ddlstudy.data import prepare_data
    from ddlstudy.training import image_dataset

    data = prepare_data(cfg)  # one batch by hand: some of its images are flipped, not all
    plain = image_dataset(cfg, data, data.train, False).__getitems__(list(range(32)))[0]
    torch.manual_seed(1)
    trained = image_dataset(cfg, data, data.train, True).__getitems__(list(range(32)))[0]
    flips = [torch.equal(t, p.flip(2)) and not torch.equal(t, p)
             for t, p in zip(trained, plain, strict=True)]
    assert 0 < sum(flips) < 32
    torch.manual_seed(1)
    one_by_one = image_dataset(dataclasses.replace(cfg, data_cache=False), data, data.train,
                               True)
    assert torch.equal(trained, torch.stack([one_by_one[i][0] for i in range(32)]))


def test_the_cache_is_built_once_rebuilt_when_damaged_and_skipped_when_unwritable(
        tmp_path, datasets_dir, tiny, monkeypatch, caplog):
    from ddlstudy.data.cache import CACHE_ENV, decoded
    from ddlstudy.data.folder import scan_imagefolder

    images = scan_imagefolder(datasets_dir / tiny.data.name, tiny.classes)
    rels = [rel for rel, _ in images.items]
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    first, why = decoded(images.root, rels, images.fingerprint, 32)
    assert first is not None and why == "" and first.array().shape == (len(rels), 32, 32, 3)
    built = first.file.stat().st_mtime_ns
    again, _ = decoded(images.root, rels, images.fingerprint, 32)
    assert again == first and again.file.stat().st_mtime_ns == built  # read, not rebuilt
    with open(first.file, "r+b") as f:  # a cut-short file is rebuilt, not read
        f.truncate(100)
    rebuilt, _ = decoded(images.root, rels, images.fingerprint, 32)
    assert rebuilt.file.stat().st_size == len(rels) * 32 * 32 * 3
    assert np.array_equal(rebuilt.array(), again.array())
    assert not list((tmp_path / "cache").glob(".*tmp*"))
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "file" / "cache"))
    none, why = decoded(images.root, rels, images.fingerprint, 32)
    assert none is None and str(tmp_path / "file") in why and CACHE_ENV in why


def test_a_tree_is_decoded_once_per_content(imagefolder, tiny, monkeypatch):
    """A second scan of the same files only hashes them (and finds the same bad image); a
    file whose content changed is decoded again, and a damage is caught."""
    from PIL import Image

    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    bad = imagefolder / "smoke" / "smoke_00003.jpg"
    bad.write_bytes(bad.read_bytes()[:200])
    first = scan_imagefolder(imagefolder, tiny.classes, BadImagePolicy.SKIP)
    assert len(opened) == tiny.data.images and [f for f, _ in first.skipped] == \
        ["smoke/smoke_00003.jpg"]
    opened.clear()
    again = scan_imagefolder(imagefolder, tiny.classes, BadImagePolicy.SKIP)
    assert opened == [] and again == first
    with pytest.raises(DataError, match="smoke_00003.jpg"):
        scan_imagefolder(imagefolder, tiny.classes)  # the policy still applies
    other = imagefolder / "fire" / "fire_00001.jpg"
    other.write_bytes(other.read_bytes()[:100])
    changed = scan_imagefolder(imagefolder, tiny.classes, BadImagePolicy.SKIP)
    assert len(opened) == tiny.data.images
    assert [f for f, _ in changed.skipped] == ["fire/fire_00001.jpg", "smoke/smoke_00003.jpg"]


def test_a_file_unchanged_since_its_last_hash_is_not_read_again(imagefolder, tiny,
                                                                 monkeypatch):
    """A scan keeps each file's digest by its size, times and inode (once they are 2 s
    old), and an entry that is not a digest is none: the next one reads only the files
    whose stat moved. A file written again, its modification time set
    back, is read again (its change time cannot be set back); a file that reads but does
    not decode is kept like any other (the checked-images memo says it is bad); one that
    cannot be read is never kept: it is read, and said, every time."""
    import os

    from ddlstudy.data import folder

    read = []
    real = folder.read_bytes
    monkeypatch.setattr(folder, "read_bytes",
                        lambda path, *a, **k: read.append(path.name) or real(path, *a, **k))
    first = scan_imagefolder(imagefolder, tiny.classes)  # the copy's files changed just now:
    read.clear()  # too fresh to keep (one could change again within the clock's tick)
    assert scan_imagefolder(imagefolder, tiny.classes) == first
    assert len(read) == tiny.data.images
    monkeypatch.setattr(folder, "SETTLED_NS", 0)  # settled at once, from here on
    read.clear()
    assert scan_imagefolder(imagefolder, tiny.classes) == first
    assert len(read) == tiny.data.images
    read.clear()
    assert scan_imagefolder(imagefolder, tiny.classes) == first and read == []
    memo = folder._digests_file(imagefolder.resolve())  # an entry spoilt is read again
    kept = json.loads(memo.read_text())
    kept["fire/fire_00002.jpg"][4] = None
    memo.write_text(json.dumps(kept))
    assert scan_imagefolder(imagefolder, tiny.classes) == first
    assert read == ["fire_00002.jpg"]
    read.clear()
    same = imagefolder / "fire" / "fire_00001.jpg"
    st = same.stat()
    same.write_bytes(same.read_bytes())
    os.utime(same, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert same.stat().st_mtime_ns == st.st_mtime_ns
    assert scan_imagefolder(imagefolder, tiny.classes) == first and read == [same.name]
    bad = imagefolder / "smoke" / "smoke_00003.jpg"
    bad.write_bytes(bad.read_bytes()[:200])  # readable, but no image: decoded once
    for again in (False, True):
        read.clear()
        skipped = scan_imagefolder(imagefolder, tiny.classes, BadImagePolicy.SKIP).skipped
        assert [f for f, _ in skipped] == ["smoke/smoke_00003.jpg"]
        assert (read == []) if again else (read[0] == bad.name)
    bad.write_bytes(b"")  # unreadable: never kept
    for _ in range(2):
        read.clear()
        skipped = scan_imagefolder(imagefolder, tiny.classes, BadImagePolicy.SKIP).skipped
        assert skipped == (("smoke/smoke_00003.jpg", "empty file"),)
        assert read[0] == bad.name
