"""The course machinery: building the notebooks and grading them.

- ``build``, ``cli``: ``ddp-lab build / check / grade / doctor``;
- ``grading``, ``checks/chNN``: ``dl.grade`` and the hidden-case checkers, one module per
  chapter; ``grader``: ``ddp-lab check`` / ``ddp-lab grade`` (tamper check, gradebook);
  ``verdict``, ``runner``, ``learner``, ``wire``, ``sandbox``: verdicts computed outside the
  learner's kernel, each submission in a bubblewrap sandbox; ``export``: Gradescope, Classroom;
- ``notebook``: ``dl.setup``, ``dl.tr``, ``dl.show_source``.
"""
