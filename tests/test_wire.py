"""What a run's processes send each other: data, never code (ddlstudy.wire)."""

import os
import pickle

import pytest
import torch

from ddlstudy import wire
from ddlstudy.data import DataPlan, prepare_data
from ddlstudy.errors import ConfigError, DataError, Unavailable, UsageError


@pytest.mark.parametrize("exc", [UsageError("run x completed all its epochs"),
                                 DataError("class 'fire' has no readable image"),
                                 ConfigError("--lr", "must be finite"),
                                 Unavailable("--strategy", "gpu-data needs a GPU")])
def test_a_refusal_is_raised_again_as_it_was(exc):
    sent = wire.from_json(wire.to_json(wire.refusal(exc)))
    with pytest.raises(type(exc)) as raised:
        wire.raise_if_refused(sent)
    assert type(raised.value) is type(exc) and str(raised.value) == str(exc)
    assert getattr(raised.value, "field", None) == getattr(exc, "field", None)


def test_other_messages_are_not_refusals():
    for message in (None, [], {"images": {}}, [{"refused": "x"}]):
        wire.raise_if_refused(message)


def test_a_data_plan_arrives_equal(quick_config):
    plan = prepare_data(quick_config())
    received = DataPlan.from_message(wire.from_json(wire.to_json(plan.to_message())))
    assert received == plan
    assert received.describe() == plan.describe()
    assert isinstance(received.train[0], tuple) and isinstance(received.images.items, tuple)


def test_random_states_arrive_equal():
    from ddlstudy.training.steps import rng_state

    state = rng_state()
    received = wire.from_tensors(wire.to_tensors({"rng": state, "sums": {"steps": 3}}))
    assert torch.equal(received["rng"]["torch"], state["torch"])
    assert received["rng"]["python"] == state["python"] and received["sums"] == {"steps": 3}


class _Payload:
    """What a hostile peer would send: unpickling it runs a shell command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("encode", [lambda obj: pickle.dumps(obj, protocol=2), wire.to_tensors],
                         ids=["pickle", "torch.save"])
def test_a_message_carrying_code_is_refused_unrun(tmp_path, encode):
    marker = tmp_path / "ran"
    data = encode({"rng": [_Payload(marker)]})
    with pytest.raises(Exception) as raised:
        wire.from_tensors(data)
    assert "system" in str(raised.value) or "weights" in str(raised.value).lower()
    assert not marker.exists()
    with pytest.raises(ValueError):  # JSON has no objects at all
        wire.from_json(data)
    assert not marker.exists()
