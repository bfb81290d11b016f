"""The ``ddp-lab`` command: build the course, check or grade exercises, inspect the machine."""

from __future__ import annotations

import argparse
import sys

from ddp_lab.i18n import _t


def _build(args: argparse.Namespace) -> int:
    from ddp_lab.course import build

    if args.check:
        problems = build.check_stale()
        for p in problems:
            print(p)
        return 1 if problems else 0
    only = args.chapters or None
    chosen = [s for s in build.sources() if not only or any(s.stem.startswith(o) for o in only)]
    if not chosen:  # a typo (`build 2` for 02) wrote nothing and said nothing
        names = ", ".join(s.stem for s in build.sources())
        print(f"ddp-lab build: no chapter source matches {' '.join(only or [])}; "
              f"chapters/ has: {names}", file=sys.stderr)  # fmt: skip
        return 2
    written = build.build(only=only)
    for path in written:
        print(f"wrote {path.relative_to(build.ROOT)}")
    if not written:
        print(f"up to date: {len(chosen)} chapter source(s), nothing to write")
    return 0


def _exercise(args: argparse.Namespace) -> int:
    from ddp_lab.course import build

    code, message = build.copy_exercise(
        args.chapter, args.notebook_lang or args.lang or "en", force=args.force
    )
    print(message, file=sys.stderr if code else sys.stdout)
    return code


def _check(args: argparse.Namespace) -> int:
    from ddp_lab.course.grading import grader

    return grader.check_main(args)


def _grade(args: argparse.Namespace) -> int:
    from ddp_lab.course.grading import grade_class

    return grade_class.grade_main(args)


def _gradescope(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ddp_lab.course import build
    from ddp_lab.course.grading import export

    release = Path(args.release)
    if not release.is_file():
        print(f"no such file: {release}", file=sys.stderr)
        return 2
    out = export.write_gradescope_zip(
        release, Path(args.out), args.seed, build.ROOT, args.torch, args.torch_index
    )
    print(f"wrote {out}")
    return 0


def _classroom(args: argparse.Namespace) -> int:
    from pathlib import Path

    import nbformat

    from ddp_lab.course.grading import classroom, export
    from ddp_lab.course.grading.release import exercises_of

    release = Path(args.release)
    if not release.is_file():
        print(f"no such file: {release}", file=sys.stderr)
        return 2
    exercises = exercises_of(nbformat.read(release, as_version=4))
    notebook = args.notebook or str(release)
    if args.target == "github-classroom":
        print(
            _t(
                "note: GitHub Classroom is being retired (its deprecation notice, "
                "github/gh-classroom#119, 2026-07-14); courses move to Classroom 50: "
                "ddp-lab classroom --target classroom50.",
            ),
            file=sys.stderr,
        )
        out = Path(args.out or ".github/workflows/classroom.yml")
        text = export.classroom_workflow(release, notebook, exercises, args.torch_index)
        # The template repository is where the workflow goes (.github/workflows/ in it).
        template = out.resolve().parent.parent.parent
    else:
        folder = Path(args.out or "autograder")
        out = folder / "autograder.py"
        text = classroom.classroom50_autograder(
            release, notebook, exercises, args.package, args.torch_index
        )
        folder.mkdir(parents=True, exist_ok=True)
        (folder / release.name).write_bytes(release.read_bytes())  # graded against this copy
        template = Path.cwd()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}")
    if args.target == "classroom50":
        print(
            _t(
                "Put the files of {folder} in CLASSROOM/autograders/ASSIGNMENT/ of your "
                "classroom50 repository; the assignment's runtime needs Python 3.11 and the "
                "apt packages bubblewrap and iproute2 (docs/INSTRUCTORS.md).",
                folder=str(out.parent),
            )
        )
        if args.package == ".":
            print(
                _t(
                    "note: the autograder installs ddp-lab from the learner's own checkout "
                    "(--package .): a learner can change what grades them. Pass --package "
                    "with your course repository at a commit (git+https://...@COMMIT).",
                ),
                file=sys.stderr,
            )
    leaks = [d for d in ("solutions", "chapters") if (template / d).is_dir()]
    if leaks and args.target == "github-classroom":
        print(
            _t(
                "warning: this template repository has {folders}: both hold the "
                "solutions (chapters/ between ### BEGIN SOLUTION markers). Remove them "
                "before learners get it; ddp-lab check works without them.",
                folders=", ".join(leaks),
            ),
            file=sys.stderr,
        )
    return 0


def _site(args: argparse.Namespace) -> int:
    from ddp_lab.course import site

    return site.site_main(args)


def _doctor(args: argparse.Namespace) -> int:
    from ddp_lab.tools import doctor

    return doctor.main(args)


def _hosts(args: argparse.Namespace) -> int:
    from ddp_lab.cluster import hosts

    if args.action == "down":
        for name in hosts.down(all_clusters=args.all):
            print(f"removed {name}")
        return 0
    if args.action == "status":
        for tag, state in hosts.clusters().items():
            owner = "running" if state["alive"] else "orphan (removed by `ddp-lab hosts down`)"
            names = ", ".join(f"{h['hostname']}={h['addr']}" for h in state.get("hosts", []))
            link = ""
            if state.get("rate_mbit") or state.get("delay_ms"):
                link = f"; links: {state.get('rate_mbit')} Mbit/s, delay {state.get('delay_ms')} ms"
            print(f"{tag}: {owner}; {names}{link} (namespaces {', '.join(hosts.namespaces(tag))})")
        return 0
    try:
        hosts.check_shaping(args.rate_mbit, args.delay_ms)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    reason = hosts.unavailable_reason() or hosts.shaping_unavailable_reason(
        args.rate_mbit, args.delay_ms
    )
    if reason:
        print(reason, file=sys.stderr)
        return 2
    c = hosts.Cluster(args.n, etc_hosts=args.etc_hosts, rate_mbit=args.rate_mbit,
                      delay_ms=args.delay_ms)  # fmt: skip
    try:
        c.up()
    except BaseException:
        c.down()
        raise
    c.owner_gone()  # it outlives this command: `down` removes it
    for h in c.hosts:
        print(f"{h.hostname} {h.addr} {h.ifname}: ip netns exec {h.netns} ...")
    return 0


def _slurm(args: argparse.Namespace) -> int:
    from ddp_lab.cluster import slurm

    if args.action == "down":
        for name in slurm.down(all_clusters=args.all):
            print(f"removed {name}")
        return 0
    if args.action == "status":
        for line in slurm.status():
            print(line)
        return 0
    reason = slurm.unavailable_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    c = slurm.Cluster(args.n).up()
    assert c.hosts is not None
    c.hosts.owner_gone()  # it outlives this command: `down` removes it
    print(c.run(["sinfo"]).stdout.rstrip())
    print(
        f"on the login node: ip netns exec {c.hosts[0].netns} env SLURM_CONF={c.env['SLURM_CONF']}"
        " sbatch JOB.sbatch"
    )
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddp-lab", description=__doc__)
    parser.add_argument("--lang", choices=["en", "zh"], help="language of messages")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="generate notebooks, exercises and solutions from chapters/")
    p.add_argument("chapters", nargs="*", help="chapter prefixes, e.g. 00 03 (default: all)")
    p.add_argument("--check", action="store_true", help="only report stale generated files")
    p.set_defaults(func=_build)

    p = sub.add_parser("exercise", help="copy an exercise notebook to work/ to work on it")
    p.add_argument("chapter", help="the chapter number, e.g. 05")
    p.add_argument("--lang", dest="notebook_lang", choices=["en", "zh"], help="default: en")
    p.add_argument("--force", action="store_true", help="replace an existing copy")
    p.set_defaults(func=_exercise)

    p = sub.add_parser("check", help="run your exercise notebook and show the points")
    p.add_argument("notebook")
    p.add_argument("--cell-timeout", type=float, default=300)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--only", metavar="ID", help="check one exercise (e.g. 00.average)")
    p.add_argument(
        "--all-cells",
        action="store_true",
        help="run every code cell, as ddp-lab grade does (default: only the cells the "
        "graded cells need)",
    )
    p.set_defaults(func=_check)

    p = sub.add_parser("grade", help="grade submissions against a released exercise notebook")
    p.add_argument("--release", required=True, help="the released exercise notebook")
    p.add_argument("submissions", nargs="+", help="submission notebooks or folders")
    p.add_argument(
        "--out", default=".", help="where the gradebook and feedback go (default: this folder)"
    )
    p.add_argument(
        "--student",
        metavar="NAME",
        action="append",
        help="grade only this student of the submissions (repeatable), keeping the other "
        "students' rows of --out's gradebook: a regrade",
    )
    p.add_argument(
        "--cell-timeout", type=float, default=300, help="seconds per cell (default: 300)"
    )
    p.add_argument(
        "--timeout", type=float, default=1800, help="seconds per submission (default: 1800)"
    )
    p.add_argument("--jobs", type=int, default=0, help="parallel gradings (default: cores)")
    p.add_argument(
        "--gradescope", metavar="PATH", help="also write Gradescope's results.json (one submission)"
    )
    p.add_argument(
        "--memory-gb", type=float, default=None, help="memory of one submission's cgroup (8)"
    )
    p.add_argument("--pids", type=int, default=None, help="processes of one submission (1024)")
    p.set_defaults(func=_grade)

    p = sub.add_parser("gradescope", help="write a Gradescope autograder zip for a release")
    p.add_argument("--release", required=True, help="the released exercise notebook")
    p.add_argument("--seed", required=True, help="your DDP_LAB_GRADE_SEED (kept in the zip)")
    p.add_argument("--out", default="autograder.zip")
    p.add_argument("--torch", default="torch==2.13.0", help="torch requirement for the image")
    p.add_argument(
        "--torch-index",
        default="https://download.pytorch.org/whl/cpu",
        help="pip index for torch (default: PyTorch's CPU wheels; '' for PyPI's default)",
    )
    p.set_defaults(func=_gradescope)

    p = sub.add_parser(
        "classroom",
        help="write a Classroom 50 autograder (or the GitHub Classroom workflow, being retired)",
    )
    p.add_argument("--release", required=True, help="the released exercise notebook")
    p.add_argument("--notebook", help="the notebook's path in the learners' repository")
    p.add_argument(
        "--target",
        choices=["classroom50", "github-classroom"],
        default="classroom50",
        help="classroom50 (default): autograder.py writing result.json; github-classroom: "
        "the old workflow (GitHub Classroom is being retired)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="classroom50: a folder (default: autograder/); github-classroom: the workflow "
        "file (default: .github/workflows/classroom.yml)",
    )
    p.add_argument(
        "--package",
        default=".",
        help="classroom50: pip spec the autograder installs ddp-lab from (default: '.', the "
        "learner's checkout; better your course repository at a commit)",
    )
    p.add_argument(
        "--torch-index",
        default="https://download.pytorch.org/whl/cpu",
        help="extra pip index for torch (default: PyTorch's CPU wheels; '' for PyPI only)",
    )
    p.set_defaults(func=_classroom)

    p = sub.add_parser("site", help="build the course website (lessons with their outputs)")
    p.add_argument("--out", default="build/site", help="where the site goes (default: build/site)")
    p.add_argument(
        "--cache",
        default="build/nb-cache",
        help="executed lessons, by a hash of the notebook (test.sh's pytest fills it)",
    )
    p.add_argument("--work", default="build/site-work", help="Sphinx sources and environment")
    p.add_argument(
        "--repo-url",
        default=None,
        help="the repository the pages tell readers to clone (default: $GITHUB_REPOSITORY's "
        "on GitHub, else this checkout's origin when it is an https URL)",
    )
    p.add_argument(
        "--missing",
        choices=["run", "fail", "blank"],
        default="run",
        help="a lesson not in the cache: run it (default), fail, or show it without outputs",
    )
    p.add_argument("--jobs", type=int, default=2, help="lessons run at a time (default: 2)")
    p.add_argument(
        "--live-labs",
        action="store_true",
        help="run the cluster labs of chapters 04, 09, 11 live (hosts, Slurm; needs root) "
        "instead of showing their stored runs (the default unless DDP_LAB_STORED_RUNS is set)",
    )
    p.set_defaults(func=_site)

    p = sub.add_parser("doctor", help="check the GPU driver, CUDA, PyTorch and NCCL setup")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_doctor)

    p = sub.add_parser("hosts", help="a local cluster of hosts (network namespaces, needs root)")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("n", nargs="?", type=int, default=2, help="hosts to build (up)")
    p.add_argument("--etc-hosts", choices=["debian", "cluster"], default="debian")
    p.add_argument("--rate-mbit", type=float, default=None,
                   help="up: each host's link carries at most this many Mbit/s each way (tbf)")  # fmt: skip
    p.add_argument("--delay-ms", type=float, default=None,
                   help="up: delay added to what each host sends (netem, if the kernel has it)")  # fmt: skip
    p.add_argument("--all", action="store_true", help="down: also clusters still in use")
    p.set_defaults(func=_hosts)

    p = sub.add_parser("slurm", help="Slurm on a local cluster of hosts (needs root, slurm-wlm)")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("n", nargs="?", type=int, default=2, help="nodes (up)")
    p.add_argument("--all", action="store_true", help="down: also clusters still in use")
    p.set_defaults(func=_slurm)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if args.lang:
        from ddp_lab.i18n import set_language

        set_language(args.lang)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
