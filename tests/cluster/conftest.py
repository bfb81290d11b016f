"""tests/cluster runs every cluster lab live, whatever ``DDP_LAB_STORED_RUNS`` says.

test.sh sets ``DDP_LAB_STORED_RUNS=1`` for the lessons: their cluster labs print the stored runs,
and this folder is where those labs run for real (hosts in namespaces, Slurm, the elastic and
preemption runs), once per CI run. A test here that wants the stored runs sets the variable
itself (``monkeypatch.setenv``).
"""

from __future__ import annotations

import pytest

from ddp_lab.cluster import STORED_RUNS


@pytest.fixture(autouse=True)
def _labs_run_live(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STORED_RUNS, raising=False)
