"""Issue 40 item 8: on a machine with a GPU, the reference solutions earn every checker's
points (self-study ``dl.grade``'s way: ``LocalLearner``, gloo ranks under ``dl.spawn``).

On the first GPU run (torch 2.11) ``10.fsdp_reduce`` and ``11.resume`` gave 0 points to the
solutions; nbval showed no verdict line. These tests print the line, so a failure says why.
The checkers whose ranks compute on CPU are run here with CUDA visible to them, which is
what differs on a GPU machine.
"""

from __future__ import annotations

import pytest
from _solutions import graded_solution
from ddp_lab.course.learner import LocalLearner

from ddp_lab.course.grading import load_checkers, run_checker

GPU_SENSITIVE = ["10.fsdp_reduce", "10.sharded_optimizer", "10.bf16_hook", "11.resume"]


@pytest.mark.gpu
@pytest.mark.parametrize("grade_id", GPU_SENSITIVE)
def test_gpu_reference_solution_gets_full_points(grade_id: str) -> None:
    passed, line = run_checker(load_checkers()[grade_id], LocalLearner(graded_solution(grade_id)))
    print(line)
    assert passed, line
