"""course.wire: only plain data crosses from the learner's process; everything else is refused."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ddp_lab.course.grading import wire

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool, torch.uint8]


@given(
    shape=st.lists(st.integers(0, 4), max_size=3),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_tensors_round_trip_exactly(shape: list[int], dtype: torch.dtype, seed: int) -> None:
    t = (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 100).to(dtype)
    back = wire.loads(wire.dumps(t))
    assert back.dtype == t.dtype and back.shape == t.shape
    assert torch.equal(back, t)


def test_non_contiguous_and_strided_views() -> None:
    t = torch.arange(12.0).reshape(3, 4).t()[1:]
    assert torch.equal(wire.loads(wire.dumps(t)), t)


def test_nested_data_round_trip() -> None:
    value = {"a": [1, 2.5, None, True, "x"], "b": (1, (2, 3)), "nan": math.inf}
    back = wire.loads(wire.dumps(value))
    assert back == value
    assert isinstance(back["b"], tuple) and isinstance(back["b"][1], tuple)
    assert math.isnan(wire.loads(wire.dumps(float("nan"))))


class Sneaky(int):
    def __eq__(self, other: object) -> bool:  # a learner's "always equal" value
        return True

    __hash__ = int.__hash__


class Everything:
    def __eq__(self, other: object) -> bool:
        return True


@pytest.mark.parametrize(
    "value",
    [
        Everything(),
        Sneaky(3),
        [Everything()],
        {"k": Everything()},
        {1: 2},
        {"__tensor__": 1},
        lambda: 0,
        object,
        b"bytes",
        {1.5},
    ],
)
def test_objects_with_behaviour_are_refused(value: object) -> None:
    with pytest.raises(wire.WireError):
        wire.dumps(value)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        json.dumps({"__tensor__": {"dtype": "float32", "shape": [3], "data": ""}}),
        json.dumps({"__tensor__": {"dtype": "object", "shape": [1], "data": ""}}),
        json.dumps({"__tensor__": {"dtype": "float32", "shape": [-1], "data": ""}}),
        json.dumps({"__float__": "1.5"}),
        json.dumps({"__float__": "__import__('os')"}),
        "[" * 100 + "]" * 100,
    ],
)
def test_malformed_messages_are_refused(text: str) -> None:
    with pytest.raises((wire.WireError, ValueError)):
        wire.loads(text)


def test_size_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MAX_BYTES", 1000)
    with pytest.raises(wire.WireError):
        wire.dumps(torch.zeros(1000))
    with pytest.raises(wire.WireError):
        wire.loads("[" + "0," * 1000 + "0]")


def test_an_encoder_keeps_what_it_was_made_with(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graded rank makes its encoder before any learner code runs: what the learner's code
    replaces later (for a moment, from a finalizer or a thread: ``course.grading.freeze``
    compares only after each probe) does not change what the rank sends."""
    import base64
    import builtins
    import json.encoder

    value = {"out": torch.arange(6.0).reshape(2, 3), "after": (1.5, float("inf"), "x")}
    encode = wire.encoder()
    want = encode(value)

    def forged(*args: object, **kwargs: object) -> object:
        raise AssertionError("the learner's replacement ran")

    monkeypatch.setattr(base64, "b64encode", forged)
    monkeypatch.setattr(json, "dumps", forged)
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    monkeypatch.setattr(json.encoder, "_make_iterencode", forged)
    monkeypatch.setattr(builtins, "repr", forged)
    monkeypatch.setattr(torch.Tensor, "numpy", forged, raising=False)
    monkeypatch.setattr(torch.Tensor, "detach", forged, raising=False)
    monkeypatch.setattr(wire, "WireError", KeyError)
    assert encode(value) == want
    monkeypatch.undo()
    assert wire.loads(want)["out"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_a_tensor_subclass_is_sent_as_a_plain_tensor_without_its_torch_function() -> None:
    calls = []

    class Loud(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            calls.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    t = torch.arange(4.0).as_subclass(Loud)
    calls.clear()
    back = wire.loads(wire.dumps(t))
    assert calls == [] and type(back) is torch.Tensor and back.tolist() == [0.0, 1.0, 2.0, 3.0]
