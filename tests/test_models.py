import pytest
import torch

from ddlstudy.config import ModelSpec
from ddlstudy.models import ScaledAlexNet, ScaledVGG16, build_model, count_parameters


@pytest.mark.parametrize("arch, params", [("alexnet", 57_016_131), ("vgg16", 134_272_835)])
def test_full_width_is_torchvision_with_three_classes(arch, params):
    model = build_model(ModelSpec(arch=arch), 3)
    assert type(model).__module__.startswith("torchvision")
    assert count_parameters(model) == params


@pytest.mark.parametrize("cls, size", [(ScaledAlexNet, 64), (ScaledVGG16, 64)])
def test_scaled_models_keep_the_layer_structure(cls, size):
    full = build_model(ModelSpec(arch="alexnet" if cls is ScaledAlexNet else "vgg16"), 3)
    small = cls(3, 0.25)
    kinds = lambda m: [type(x).__name__ for x in m.modules()]  # noqa: E731
    assert kinds(small)[1:] == kinds(full)[1:]
    assert count_parameters(small) < count_parameters(full) / 10
    assert small(torch.zeros(2, 3, size, size)).shape == (2, 3)


def test_scaled_alexnet_at_width_one_matches_torchvision_shapes():
    full = build_model(ModelSpec(arch="alexnet"), 3)
    mine = ScaledAlexNet(3, 1.0)
    assert [p.shape for p in mine.parameters()] == [p.shape for p in full.parameters()]
