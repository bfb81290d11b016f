"""The learner's loop: the cells ``ddp-lab check`` runs, demos on stubs, concept checks."""

from __future__ import annotations

import nbformat
import pytest

from ddp_lab.course import build
from ddp_lab.course.grading.checks import answers, concepts
from ddp_lab.course.grading.needed import needed_cells
from ddp_lab.course.site import https_url


def test_slice_keeps_what_the_graded_cell_reaches_and_skips_demos():
    cells = [
        "import torch\nimport torch.distributed as dist",
        "sizes = [2 ** k for k in range(20)]\nfor s in sizes:\n    bench(s)",  # a sweep
        "def helper(x):\n    return x + 1",
        "def ring(t):\n    return helper(t) + torch.zeros(1)",
        "%%ddp -n 3\nprint(ring(torch.ones(1)))",  # the demo: binds nothing here
        "%matplotlib inline\nplot(sizes)",
        'dl.grade("05.ring", ring)',
    ]
    assert needed_cells(cells, [6]) == [0, 2, 3, 6]


def test_slice_follows_a_name_rebound_later_and_gives_up_where_names_are_hidden():
    cells = ["x = 1", "x = x + 1", "y = 5", 'dl.grade("00.x", x)']
    assert needed_cells(cells, [3]) == [0, 1, 3]
    for opaque in ("exec('z = 1')", "from os import *", "globals()['z'] = 1", "def f(:"):
        assert needed_cells(["z = 1", opaque, 'dl.grade("00.z", z)'], [2]) is None


def test_answers_block_is_kept_in_solutions_only():
    src = 'my_answers = {\n    ### BEGIN ANSWERS\n    1: "c",  # a letter\n    2: 15,  # a number\n    ### END ANSWERS\n}'
    assert (
        build.answers(src, keep=True)
        == 'my_answers = {\n    1: "c",  # a letter\n    2: 15,  # a number\n}'
    )
    stub = build.answers(src, keep=False)
    assert '"c"' not in stub and "15" not in stub
    assert "1: None,  # a letter" in stub and "2: None,  # a number" in stub


@pytest.mark.parametrize("chapter", sorted(concepts.QUIZZES))
def test_every_chapter_ends_with_its_concept_checks(chapter):
    """Both languages show every question; the solution's answers are the key; the exercise's
    are all unanswered; the letters are spread (no position gives the answer away)."""
    (src,) = build.sources()[int(chapter) : int(chapter) + 1]
    quiz = concepts.QUIZZES[chapter]
    assert 4 <= len(quiz) <= 8
    for lang in build.LANGS:
        sol = nbformat.reads(
            build.dumps(build.targets(src)[build.ROOT / "solutions" / lang / f"{src.stem}.ipynb"]),
            as_version=4,
        )
        text = "\n".join(c.source for c in sol.cells if c.cell_type == "markdown")
        for i in range(1, len(quiz) + 1):
            assert f"**{i}.**" in text
        (cell,) = [c for c in sol.cells if c.cell_type == "code" and "dl.quiz(" in c.source]
        ns: dict = {}
        exec(cell.source.split("dl.quiz")[0], ns)  # the answers dict only
        got = answers.clean(ns["my_answers"])
        assert all(concepts.judge(q, got[str(i)]) == "right" for i, q in enumerate(quiz, 1))
        for q in quiz:
            if isinstance(q.key, str):
                assert set(q.wrong) == set("abcd"[: q.choices]) - {q.key}
            assert concepts.why(q, q.key if isinstance(q.key, str) else float(q.key))


def test_key_letters_are_spread():
    letters = [q.key for qs in concepts.QUIZZES.values() for q in qs if isinstance(q.key, str)]
    counts = {x: letters.count(x) for x in "abcd"}
    assert max(counts.values()) <= len(letters) // 2, counts


def test_quiz_judges_letters_numbers_and_blanks():
    q = concepts.Question(key=15.0, tol=0.02, right="r", wrong={"": "w"})
    assert concepts.judge(q, 15.2) == "right" and concepts.judge(q, 16.0) == "wrong"
    assert concepts.judge(q, None) == "unanswered"
    c = concepts.Question(key="c", right="r", wrong={"a": "wa"}, choices=4)
    assert concepts.judge(c, "(c)") == "right" and concepts.why(c, "a") == "wa"
    assert answers.clean({"1": "a", 2: 3}) == {"1": "a", "2": 3.0}  # "1" is question 1
    assert answers.clean({1.0: "a"}) == answers.clean({"²": "a"}) == "bad_key"
    assert answers.clean([1, 2]) == "not_a_dict"
    assert answers.clean({3: ["a"]}) == "bad_value:3"
    # the wrong kind of answer is said as such, not explained as a wrong choice or number
    assert "quotes" in concepts.why(c, 3.0) and "a, b, c, d" in concepts.why(c, 3.0)
    assert "without quotes" in concepts.why(q, "15")


def test_a_wrong_form_is_said_in_the_learners_language_never_in_the_processes_words(capsys):
    from ddp_lab import i18n
    from ddp_lab.course.quiz import quiz

    assert answers.form_message("bad_value:3").startswith("answer 3:")
    # a string that did not come from answers.clean (a process that ran learner code may
    # send anything) is never shown
    assert answers.form_message("\x1b[31mFULL MARKS") == answers.form_message(None)
    try:
        i18n.set_language("zh")
        quiz("12", [1, 2])  # no traceback: the form's message, in the learner's language
        said = capsys.readouterr().out.strip()
    finally:
        i18n.set_language("en")
    form = "the answers must be a dict of question numbers and answers, as given"
    assert said == i18n._t(form, "zh") != i18n._t(form, "en")  # the zh text, not the en


def test_demo_on_a_stub_says_not_solved_and_other_errors_still_raise():
    from IPython.core.interactiveshell import InteractiveShell

    from ddp_lab.course import unsolved

    shell = InteractiveShell()
    unsolved.install(shell)
    shell.run_cell('def f():\n    raise NotImplementedError("your code here")')
    assert shell.run_cell("f()").success
    assert shell.run_cell("1 + 1").result == 2  # a cell's value is still displayed
    bad = shell.run_cell('raise NotImplementedError("something else")')
    assert not bad.success and isinstance(bad.error_in_exec, NotImplementedError)


def test_clone_url_from_git_remotes():
    assert https_url("git@github.com:me/ddp-lab.git") == "https://github.com/me/ddp-lab"
    assert https_url("ssh://git@example.org/me/ddp-lab") == "https://example.org/me/ddp-lab"
    assert https_url("https://github.com/me/ddp-lab") == "https://github.com/me/ddp-lab"
    assert https_url("https://user:token@github.com/me/r") == ""
    assert https_url("/srv/git/ddp-lab") == ""
