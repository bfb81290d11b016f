"""The course machinery: building the notebooks and the website, and grading them.

- ``build`` (with ``cjk_breaks``), ``nbcache``, ``lab_contents``, ``site`` (with ``site_pages``),
  ``cli``: ``ddp-lab build / site / check / grade / doctor``;
- ``notebook``: ``dl.setup``, ``dl.tr``, ``dl.show_source``;
- ``grading/``: ``dl.grade``, the hidden-case checkers (``grading/checks/chNN``) and the
  pipeline of ``ddp-lab check`` / ``ddp-lab grade`` (its ``__init__`` names the stages).
"""

import sys

# nbformat validates with jsonschema, and jsonschema builds the Lark grammar of the optional
# ``rfc3987_syntax`` (its "iri" format) when it is imported: about 0.9 s of CPU in every process
# that imports nbformat. No notebook schema uses that format, and the grader starts such a
# process per submission (``verdict``; ``intake`` does the same in its own code), so the
# course's processes leave it out; jsonschema skips a format whose module is missing.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[assignment]
