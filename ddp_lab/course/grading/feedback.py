"""Stage 6 of grading, report: what a learner reads about one submission.

One line per exercise and a total (``ddp-lab check`` prints them; ``ddp-lab grade`` writes them
to ``feedback/NAME.md``). Details quote the learner's code and output: they are escaped
(``report``) before they reach a terminal or Markdown. The class's files (gradebook, totals,
Gradescope's results, the similarity report) are ``report``'s, ``export``'s and
``similarity``'s.
"""

from __future__ import annotations

from ddp_lab.course.grading import report
from ddp_lab.course.grading.judge import MESSAGES, Result
from ddp_lab.i18n import _t, lookup


def report_lines(results: list[Result], lang: str, markdown: bool = False) -> list[str]:
    """One line per exercise and a total, in ``lang``. Details (which quote the learner's
    code and output) are escaped: in a fenced block with ``markdown``, else one escaped
    text for a terminal."""
    lines = []
    for r in results:
        lines.append(
            f"- {r.grade_id}: " + lookup(MESSAGES, r.status, lang) + f", {r.points}/{r.max_points}"
        )
        if r.detail and r.status != "passed":
            if markdown:  # indented inside the fence: no line of it starts like one of ours
                block = report.code_block(r.detail).split("\n")
                inner = ["  " + line for line in block[1:-1]]
                lines.append("\n" + "\n".join([block[0], *inner, block[-1]]) + "\n")
            else:
                lines.append("  " + report.clean(r.detail, newlines=True).replace("\n", "\n  "))
    total = _t(
        "total {points}/{max_points} points",
        lang,
        points=sum(r.points for r in results),
        max_points=sum(r.max_points for r in results),
    )
    return [*lines, total]


def feedback_markdown(
    identity: str, title: str, results: list[Result], lang: str, others: list[str]
) -> str:
    """``feedback/NAME.md`` of one submission: a heading, its lines, the files not graded."""
    student = report.code_span(identity, report.MAX_NAME)
    text = [
        ("# " + _t("Feedback for {student}: {title}", lang, student=student, title=title)),
        "",
        *report_lines(results, lang, markdown=True),
        "",
    ]
    if others:
        files = ", ".join(report.code_span(f, report.MAX_NAME) for f in others)
        text += [_t("also found, not graded: {files}", lang, files=files), ""]
    return "\n".join(text)
