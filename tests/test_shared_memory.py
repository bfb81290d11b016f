"""ddp_lab.labs.shared_memory: tensors sent to a child process are shared, and Hogwild trains."""

from __future__ import annotations

from ddp_lab.labs import shared_memory


def test_sent_tensor_is_shared_and_changed_in_place() -> None:
    seen = shared_memory.send_tensor()
    assert seen["shared before sending"] is False
    assert seen["shared after sending"] and seen["shared in the child"]
    assert seen["parent sees the child's add_"] == [1.0, 1.0, 1.0]
    assert set(seen["strategies"]) == {"file_descriptor", "file_system"}


def test_hogwild_trains_the_shared_model() -> None:
    out = shared_memory.hogwild(nprocs=2, steps=200)
    assert out["shared"] and out["exit codes"] == [0]
    assert max(abs(a - b) for a, b in zip(out["after"], out["target"], strict=True)) < 0.05
