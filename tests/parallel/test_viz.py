"""What the chapter's pictures draw, checked against torch and the model's sizes."""

from __future__ import annotations

import matplotlib
import torch
from torch import nn

from ddp_lab.parallel import BalancedDataParallel, DataParallel, viz

matplotlib.use("Agg")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 50))


def _step(dp: nn.Module) -> viz.Trace:
    x, y = torch.randn(12, 8), torch.randint(0, 50, (12,))
    return viz.traced_step(dp, x, y, nn.functional.cross_entropy)


def test_transfer_table_sizes() -> None:
    model = _model()
    t = _step(DataParallel(model, [0, 1, 2]))
    table = viz.transfer_table(t)
    n_params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert table["broadcast"] == {(0, 1): n_params, (0, 2): n_params}
    assert table["reduce_add"] == {(1, 0): n_params, (2, 0): n_params}
    assert table["scatter"] == {(-1, d): 4 * 8 * 4 for d in range(3)}
    out_bytes = {d: 4 * 50 * 4 for d in (1, 2)}  # 4 rows of 50 float32 logits
    assert table["gather"] == {(d, 0): n for d, n in out_bytes.items()}
    assert table["scatter_grad"] == {(0, d): n for d, n in out_bytes.items()}
    viz.plot_transfers(t, 3)
    viz.plot_timeline(t)


def test_device0_holds_more_and_balancing_reduces_it() -> None:
    model = _model()
    even = viz.memory_by_device(_step(DataParallel(model, [0, 1, 2])), model, 3)
    totals = {d: sum(m.values()) for d, m in even.items()}
    assert totals[0] > totals[1] and totals[1] == totals[2]
    assert even[0]["gathered output + grad"] == 2 * 12 * 50 * 4
    bal = viz.memory_by_device(_step(BalancedDataParallel(2, model, [0, 1, 2])), model, 3)
    assert bal[0]["input chunk"] == 2 * 8 * 4 < even[0]["input chunk"]
    assert sum(bal[0].values()) < totals[0]
    viz.plot_memory(bal)


def test_chunk_plot_data_default_is_torch_chunk() -> None:
    data = viz.chunk_plot_data(10, 4, 2)
    assert data["default"] == [c.numel() for c in torch.arange(10).chunk(4)]
    assert data["balanced"] == [2, 3, 3, 2]
    assert viz.chunk_sizes_widget().children  # builds without a browser


def test_traced_step_runs_each_replica_on_one_intra_op_thread() -> None:
    """With torch's default of one thread per core, every replica thread opened its own
    thread pool on the shared CPU: the traced backward of chapter 03's CNN took up to 3 s
    instead of 2 ms on 2 busy cores. The step runs with 1 thread and restores the setting."""
    seen: list[int] = []

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 50)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(torch.get_num_threads())
            return self.fc(x)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _step(DataParallel(Probe(), [0, 1, 2]))
        assert seen == [1, 1, 1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
