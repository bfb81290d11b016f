"""Figures and widgets of the package speak the learner's language: under zh, no English
words in any text of a figure (titles, labels, ticks, legends, annotations), apart from
identifiers and units that stay as written in both languages."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from torch import nn  # noqa: E402

from ddp_lab import (  # noqa: E402
    bench_allreduce,
    i18n,  # noqa: E402
    ranks,
)
from ddp_lab.parallel import BalancedDataParallel, DataParallel, viz  # noqa: E402

# Words that stay in English in the Chinese text too: identifiers, units, API names and the
# terms that docs/GLOSSARY.md keeps in English (rank).
ALLOWED = {
    "rank",
    "GPU",
    "cuda",
    "CUDA_VISIBLE_DEVICES",
    "KiB",
    "B",
    "GB",
    "s",
    "N",
    "busbw",
    "gpu0_bsz",
    "torch",
    "chunk",
    "dist",
    "all_reduce",
    "gloo",
}
pytestmark = pytest.mark.filterwarnings("ignore:Glyph .* missing from font")  # no CJK font here
WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def english_words(fig: matplotlib.figure.Figure) -> list[str]:
    texts = [t.get_text() for t in fig.findobj(Text)]
    return sorted({w for text in texts for w in WORD.findall(text)} - ALLOWED)


@pytest.fixture
def zh():
    before = i18n.get_language()
    i18n.set_language("zh")
    yield
    i18n.set_language(before)
    plt.close("all")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _step(dp: nn.Module):
    x, y = torch.randn(12, 8), torch.randint(0, 4, (12,))
    return viz.traced_step(dp, x, y, nn.functional.cross_entropy)


def test_transfer_timeline_and_memory_plots(zh):
    model = _model()
    t = _step(DataParallel(model, [0, 1, 2]))
    figs = {
        "transfers": viz.plot_transfers(t, 3),
        "timeline": viz.plot_timeline(t),
        "memory": viz.plot_memory(viz.memory_by_device(t, model, 3), "均分"),
        "memory balanced": viz.plot_memory(
            viz.memory_by_device(_step(BalancedDataParallel(2, model, [0, 1, 2])), model, 3)
        ),
    }
    found = {name: english_words(fig) for name, fig in figs.items()}
    assert found == {name: [] for name in figs}


def test_the_same_plots_in_english_keep_their_words():
    """The check is not vacuous: the English figure has the words the zh one must not."""
    model = _model()
    t = _step(DataParallel(model, [0, 1, 2]))
    assert {"dev", "host"} <= set(english_words(viz.plot_transfers(t, 3)))
    assert {"replica", "forward"} <= set(english_words(viz.plot_timeline(t)))
    plt.close("all")


def test_chunk_sizes_widget(zh, monkeypatch):
    shown = []
    monkeypatch.setattr(plt, "show", lambda: shown.append(plt.gcf()))
    widget = viz.chunk_sizes_widget()
    widget.update()
    assert shown and english_words(shown[-1]) == []
    sliders = [c for c in widget.children if hasattr(c, "description") and c.description]
    assert [s.description for s in sliders][:3] == ["批大小", "设备数", "gpu0_bsz（设备 0 的行数）"]
    # a long description is shown whole, not cut to "num_devi..."
    assert all(s.style.description_width == "initial" for s in sliders[:3])


def test_ranks_widget(zh, monkeypatch):
    shown = []
    monkeypatch.setattr(plt, "show", lambda: shown.append(plt.gcf()))
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: None)
    ranks.rank_table_widget(nnodes=2, nproc_per_node=4, gpus_per_node=2)  # some without a GPU
    assert shown
    texts = " ".join(t.get_text() for t in shown[-1].findobj(Text))
    assert "无 GPU" in texts and "本地" in texts
    assert english_words(shown[-1]) == []


def test_benchmark_plot(zh):
    rows = [
        {"impl": impl, "nprocs": n, "size": size, "busbw": 1.0}
        for impl in bench_allreduce.IMPLS
        for n in (2, 4)
        for size in (1024, 4096)
    ]
    ax = bench_allreduce.plot(rows)
    assert english_words(ax.figure) == []
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[0] == "手写环形，N=2"


def _pipeline_timeline():
    from ddp_lab import pipeline as pp

    events = pp.simulate([pp.gpipe_order(s, 2, 2) for s in range(2)], 2)
    results = [{"events": [list(e) for e in events if e[0] == r]} for r in range(2)]
    ax = pp.plot_timeline(results, "GPipe", formula=pp.bubble_formula(2, 2))
    # the pass labels (F0, B1) and the schedule's name stay as written in both languages
    return set(english_words(ax.figure)) - {"GPipe", "F0", "F1", "B0", "B1"}


def test_pipeline_timeline(zh):
    assert _pipeline_timeline() == set()


def test_pipeline_timeline_in_english_keeps_its_words():
    assert {"stage", "measured", "bubble", "formula"} <= _pipeline_timeline()
    plt.close("all")
