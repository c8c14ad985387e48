"""The paper's networks: torchvision's AlexNet and VGG16, or width-scaled twins of them.

At width 1.0 the model is torchvision's (``alexnet``/``vgg16`` with ``weights=None``):
the same layers made in the same order, the same initialisation, so the same weights
from the same seed (tests/test_models.py compares them), built here without importing
torchvision, whose package brings torch's compiler front end (about 1.5 s of a run's
start on a 2-core host). Below 1.0 the same layer structure is built with fewer channels
and hidden units, so the tiny use case exercises the code paths of the real ones
(including the ``features`` / ``avgpool`` / ``classifier`` split the pipeline strategy
cuts along).

Building one imports no module: ``training.worker.new_model`` imports torch's compiler
front end in the main thread while the build thread draws the weights, and two threads
importing crossing graphs of modules can deadlock (no ``.to()``, ``.half()`` or other
``Module._apply`` here: it imports ``torch._subclasses``; tests/test_models.py holds it).
"""

from __future__ import annotations

from torch import nn

from ddlstudy.config import Arch, ModelSpec

_VGG16_CFG = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
              512, 512, 512, "M"]


def _c(n: int, width: float) -> int:
    return max(4, round(n * width))


class ScaledAlexNet(nn.Module):
    """torchvision.models.AlexNet with every width multiplied by ``width``."""

    def __init__(self, num_classes: int, width: float, dropout: float = 0.5,
                 he_init: bool = True) -> None:
        super().__init__()
        c = [_c(n, width) for n in (64, 192, 384, 256, 256)]
        hidden = _c(4096, width)
        self.features = nn.Sequential(
            nn.Conv2d(3, c[0], kernel_size=11, stride=4, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(c[0], c[1], kernel_size=5, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(c[1], c[2], kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(c[2], c[3], kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(c[3], c[4], kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout), nn.Linear(c[4] * 6 * 6, hidden), nn.ReLU(inplace=True),
            nn.Dropout(p=dropout), nn.Linear(hidden, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )
        # torchvision's AlexNet keeps PyTorch's default initialisation (he_init False); at
        # reduced width that stalls at chance for hundreds of steps on small data, so He
        # initialisation there.
        for m in self.modules() if he_init else ():
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


class ScaledVGG16(nn.Module):
    """torchvision.models.vgg16 (no batch norm) with every width multiplied by ``width``."""

    def __init__(self, num_classes: int, width: float, dropout: float = 0.5) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for v in _VGG16_CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                out = _c(v, width)
                layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1),
                           nn.ReLU(inplace=True)]
                channels = out
        hidden = _c(4096, width)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(channels * 7 * 7, hidden), nn.ReLU(True), nn.Dropout(p=dropout),
            nn.Linear(hidden, hidden), nn.ReLU(True), nn.Dropout(p=dropout),
            nn.Linear(hidden, num_classes),
        )
        for m in self.modules():  # torchvision's VGG initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


def build_paper(spec: ModelSpec, num_classes: int) -> nn.Module:
    """alexnet or vgg16: torchvision's own at width 1.0 (its initialisation), the scaled
    twin below it."""
    if spec.arch is Arch.ALEXNET:
        return ScaledAlexNet(num_classes, spec.width, he_init=spec.width != 1.0)
    return ScaledVGG16(num_classes, spec.width)  # VGG's initialisation at every width
