"""The course machinery: building the notebooks and grading them.

- ``build``, ``cli``: ``ddp-lab build / check / grade / doctor``;
- ``grading``, ``checks/chNN``: ``dl.grade`` and the hidden-case checkers, one module per
  chapter; ``grader``: ``ddp-lab check`` / ``ddp-lab grade`` (tamper check, gradebook);
  ``verdict``, ``runner``, ``learner``, ``wire``, ``sandbox``: verdicts computed outside the
  learner's kernel, each submission in a bubblewrap sandbox; ``export``: Gradescope, Classroom;
- ``notebook``: ``dl.setup``, ``dl.tr``, ``dl.show_source``.
"""

import sys

# nbformat validates with jsonschema, and jsonschema builds the Lark grammar of the optional
# ``rfc3987_syntax`` (its "iri" format) when it is imported: about 0.9 s of CPU in every process
# that imports nbformat. No notebook schema uses that format, and the grader starts such a
# process per submission (``verdict``; ``intake`` does the same in its own code), so the
# course's processes leave it out; jsonschema skips a format whose module is missing.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[assignment]
