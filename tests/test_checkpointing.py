"""Activation checkpointing (issue 50, ``--checkpoint-activations``): each block's
activations are computed again in the backward instead of kept, and a checkpointed run
takes the very steps of one without (gradients, BatchNorm's statistics, dropout)."""

from __future__ import annotations

import copy

import pytest
import torch
import torchvision
from torch import nn

from ddlstudy.models.checkpointing import checkpoint_blocks
from ddlstudy.models.paper import ScaledAlexNet
from ddlstudy.report.runs import config_label
from ddlstudy.runner import run


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple:
    """One training step's loss, gradients and buffers, and how many bytes of
    activations autograd kept outside the checkpoints (what a saved-tensor hook sees)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    torch.manual_seed(1)  # the same dropout masks
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return (loss.item(), [p.grad for p in model.parameters()],
            [b.clone() for b in model.buffers()], sum(kept.values()))


@pytest.mark.parametrize("make, size, blocks", [
    (lambda: torchvision.models.resnet18(num_classes=3), 64,
     ["layer1", "layer2", "layer3", "layer4"]),
    (lambda: ScaledAlexNet(num_classes=3, width=0.25), 64, ["features", "classifier"])])
def test_a_checkpointed_model_steps_as_the_plain_one_and_keeps_less(make, size, blocks):
    torch.manual_seed(0)
    plain = make().train()
    checkpointed = copy.deepcopy(plain)
    assert checkpoint_blocks(checkpointed) == blocks
    assert list(checkpointed.state_dict()) == list(plain.state_dict())  # names unchanged
    replica = copy.deepcopy(checkpointed)  # a replica checkpoints its own modules
    calls = []
    first = next(m for m in replica.get_submodule(blocks[0]).modules()
                 if isinstance(m, nn.Conv2d))
    first.register_forward_hook(lambda *_: calls.append(1))
    x, y = torch.randn(4, 3, size, size), torch.tensor([0, 1, 2, 0])
    loss, grads, buffers, kept = _step(plain, x, y)
    for model in (checkpointed, replica):
        got = _step(model, x, y)
        assert got[0] == loss
        assert all(torch.equal(a, b) for a, b in zip(got[1], grads, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(got[2], buffers, strict=True))  # BN once
        assert got[3] < kept * 0.8  # resnet18 on 64 px: 0.76, the stem kept
    assert len(calls) == 2  # the block's forward, then again in the backward
    with torch.no_grad():  # validation keeps nothing: no recomputation to arrange
        assert torch.equal(checkpointed.eval()(x), plain.eval()(x))


def test_a_checkpointed_run_records_the_flag_and_trains_as_the_plain_run(quick_config):
    plain = run(quick_config(epochs=2, max_steps=3, snapshot=False), show_progress=False)
    checked = run(quick_config(epochs=2, max_steps=3, snapshot=False,
                               checkpoint_activations=True), show_progress=False)
    losses = [[e["train_loss"] for e in r.manifest["epochs"]] for r in (plain, checked)]
    assert losses[0] == losses[1]
    assert checked.manifest["config"]["checkpoint_activations"] is True
    assert config_label(checked.manifest) == config_label(plain.manifest) + " checkpointed"
    # what the first step saved for backward, its activations: tiny's AlexNet keeps 0.63
    # of them checkpointed (the blocks' inputs only), as the model-level test measures
    saved = [r.manifest["backend"]["memory"]["per_rank"][0]["held_bytes"]["activations"]
             for r in (plain, checked)]
    assert saved[0] > 1 << 20 and 0.5 < saved[1] / saved[0] < 0.75, saved


@pytest.mark.parametrize("strategy", ["pipeline", "cpu-threads"])
def test_a_strategy_that_cannot_checkpoint_is_refused_in_one_line(strategy, cli, tmp_path):
    code, err, runs = cli("run", "--strategy", strategy, "--checkpoint-activations")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"--checkpoint-activations: {strategy} cannot checkpoint activations yet; " \
           "strategies that can: sequential" in err and "tensor" in err
    assert not runs.exists()


def test_a_model_without_blocks_is_refused(cli, tmp_path):
    (tmp_path / "flat.py").write_text(
        "from torch import nn\n\ndef make(num_classes):\n    return nn.Sequential(\n"
        "        nn.AdaptiveAvgPool2d(1), nn.Flatten())\n\n"
        "class One(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
        "        self.pool = nn.AdaptiveAvgPool2d(1)\n        self.fc = nn.Linear(3, n)\n\n"
        "    def forward(self, x):\n        return self.fc(self.pool(x).flatten(1))\n\n"
        "def one(num_classes):\n    return One(num_classes)\n")
    code, err, runs = cli("run", "--model", f"{tmp_path / 'flat.py'}:one",
                          "--checkpoint-activations")
    assert code == 2 and err.count("\n") == 1, err
    assert "--checkpoint-activations:" in err and "has no block to checkpoint" in err
    assert not runs.exists()
