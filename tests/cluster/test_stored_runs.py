"""DDP_LAB_STORED_RUNS: the cluster labs show their stored runs in the languages it names."""

from __future__ import annotations

import pytest

from ddp_lab import i18n
from ddp_lab.cluster import lab_reason, stored_runs_asked
from ddp_lab.labs import elastic, preemption, slurm_jobs, two_hosts


@pytest.fixture
def zh_only(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DDP_LAB_STORED_RUNS", "zh")
    before = i18n.get_language()
    yield
    i18n.set_language(before)


def test_only_the_named_languages_show_stored_runs(zh_only) -> None:
    i18n.set_language("en")
    assert not stored_runs_asked()
    assert lab_reason(None) is None and lab_reason("no root") == "no root"
    i18n.set_language("zh")
    assert stored_runs_asked()
    assert lab_reason(None) == "DDP_LAB_STORED_RUNS=zh"


@pytest.mark.parametrize("value", ["1", "all", "en, zh"])
def test_every_language_when_asked(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("DDP_LAB_STORED_RUNS", value)
    assert stored_runs_asked()


def test_unset_or_empty_asks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDP_LAB_STORED_RUNS", raising=False)
    assert not stored_runs_asked()
    monkeypatch.setenv("DDP_LAB_STORED_RUNS", "")
    assert not stored_runs_asked()


def test_labs_show_the_stored_run_and_say_why(zh_only, capsys: pytest.CaptureFixture[str]) -> None:
    """Even as root with hosts and Slurm at hand, nothing live starts: every run is already there."""
    i18n.set_language("zh")
    runs = elastic.Runs()
    assert all(isinstance(r, elastic.Record) for r in runs.runs.values())
    assert runs["agent"].worlds()
    assert isinstance(preemption.Runs()._run, preemption.Record)
    assert not isinstance(slurm_jobs.Jobs()._run, slurm_jobs.Future)
    assert all(isinstance(s, two_hosts.Scenario) for s in two_hosts.Gallery().runs.values())
    out = capsys.readouterr().out
    assert out.count("已设置 DDP_LAB_STORED_RUNS=zh") == 4, out
