"""The launch tests' leak check (conftest's ``no_leaks``) is about the launcher: a folder
the grader shares between 08.fit's ranks, made by a grading that another of test.sh's pytest
runs has under way, is not a leak of the launch under test (it failed CI's run once, beside
tests/course/test_exercises.py's 08)."""

from __future__ import annotations

import os
import tempfile

import pytest
from conftest import GRADING_SHARE, shm_files, shm_left


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")
def test_a_graders_share_folder_is_not_a_launch_leak() -> None:
    before = shm_files()
    share = tempfile.mkdtemp(prefix=GRADING_SHARE, dir="/dev/shm")
    other = tempfile.mkdtemp(prefix="not-the-graders-", dir="/dev/shm")
    try:
        # a launch's leftover is still seen, the grader's folder is not
        assert shm_left(before, patience=0) == {os.path.basename(other)}
    finally:
        os.rmdir(share)
        os.rmdir(other)
