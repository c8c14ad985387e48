import dataclasses

import pytest

from ddlstudy.config import (
    Arch,
    available_usecases,
    load_usecase,
    usecase_from_dict,
    with_overrides,
)
from ddlstudy.errors import ConfigError, UsageError


def test_reference_usecases_match_the_paper():
    """The paper's networks, sets and batch; the learning rate ten times the paper's 0.001
    (a deviation the use case files explain), complex-small's target 0.60."""
    big, small = load_usecase("simple-big"), load_usecase("complex-small")
    assert (big.model.arch, big.data.images, big.train.image_size) == (Arch.ALEXNET, 6003, 224)
    assert (small.model.arch, small.data.images) == (Arch.VGG16, 791)
    for uc in (big, small):
        assert uc.classes == ("fire", "smoke", "nofire")
        assert (uc.train.lr, uc.train.momentum, uc.model.width) == (0.01, 0.9, 1.0)
        assert uc.train.batch_size == 32
    assert (big.train.target_accuracy, small.train.target_accuracy) == (0.90, 0.60)
    assert {"simple-big", "complex-small", "tiny"} <= set(available_usecases())


def test_usecase_by_path(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\n[model]\narch = "alexnet"\nwidth = 0.5\n'
                    '[data]\nname = "x"\nimages = 30\nsource_size = 64\n'
                    '[train]\nimage_size = 64\n')
    uc = load_usecase(str(path))
    assert (uc.name, uc.model.width, uc.train.batch_size) == ("mine", 0.5, 32)


def test_overrides_replace_only_given_fields(tiny):
    uc = with_overrides(tiny, epochs=3, batch_size=None)
    assert (uc.train.epochs, uc.train.batch_size) == (3, tiny.train.batch_size)


RAW = {"name": "t", "model": {"arch": "alexnet"},
       "data": {"name": "d", "images": 30, "source_size": 64}, "train": {"image_size": 64}}


@pytest.mark.parametrize("path, value, field", [
    (("model", "arch"), "res net", "model.arch"),
    (("model", "width"), 0.5, "model.arch"),  # width scales alexnet and vgg16, not resnet18

    (("model", "width"), 0, "model.width"),
    (("data", "images"), -5, "data.images"),
    (("data", "difficulty"), 2, "data.difficulty"),
    (("train", "batch_size"), 0, "train.batch_size"),
    (("train", "lr"), -0.1, "train.lr"),
    (("train", "val_fraction"), 1.0, "train.val_fraction"),
    (("train", "colour"), "red", "train.colour"),  # unknown key
])
def test_bad_values_name_the_field(path, value, field):
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in RAW.items()}
    raw[path[0]][path[1]] = value
    if (path, value) == (("model", "width"), 0.5):
        raw["model"]["arch"] = "resnet18"
    with pytest.raises(ConfigError) as err:
        usecase_from_dict(raw)
    assert err.value.field == field


def test_an_unknown_model_is_refused_with_the_nearest_names():
    from ddlstudy.config import ModelSpec
    from ddlstudy.models import check

    with pytest.raises(ConfigError, match="unknown model 'resnt18'; the nearest torchvision "
                                          "names: resnet18"):
        check(ModelSpec(arch="resnt18"), 3, 64)
    with pytest.raises(ConfigError, match="32 px is too small for alexnet; use at least 63"):
        check(ModelSpec(arch="alexnet", width=0.25), 3, 32)


def test_unknown_usecase_lists_the_names():
    with pytest.raises(UsageError, match="simple-big"):
        load_usecase("no-such-case")


def test_frozen(tiny):
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny.train.epochs = 5


def test_a_replayed_pipeline_cuts_where_its_run_did(tiny):
    """The cut decides which process draws each dropout mask: a replay of a pipeline whose
    cut was measured takes the recorded one; a given cut stays given."""
    from ddlstudy.config import RunConfig
    from ddlstudy.records.manifests import config_from_manifest

    measured = RunConfig(usecase=tiny, strategy="pipeline", stages=2)
    manifest = {"config": measured.to_dict(), "id": "run-1",
                "strategy": {"name": "pipeline", "stage_starts": [0, 16]}}
    replay = config_from_manifest(manifest)
    assert replay.stage_starts == (0, 16) and replay.replay_of == "run-1"
    given = RunConfig(usecase=tiny, strategy="hybrid", stage_starts=[0, 9])
    assert given.stage_starts == (0, 9)
    manifest = {"config": given.to_dict(), "strategy": {"stage_starts": [0, 9]}}
    assert config_from_manifest(manifest).stage_starts == (0, 9)
    plain = {"config": RunConfig(usecase=tiny).to_dict(), "strategy": {"name": "sequential"}}
    assert config_from_manifest(plain).stage_starts is None
