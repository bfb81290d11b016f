"""The ``ddp-lab`` command: build the course, check or grade exercises, inspect the machine."""

from __future__ import annotations

import argparse
import sys


def _build(args: argparse.Namespace) -> int:
    from ddp_lab.course import build

    if args.check:
        problems = build.check_stale()
        for p in problems:
            print(p)
        return 1 if problems else 0
    for path in build.build(only=args.chapters or None):
        print(f"wrote {path.relative_to(build.ROOT)}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from ddp_lab.course import grader

    return grader.check_main(args)


def _grade(args: argparse.Namespace) -> int:
    from ddp_lab.course import grader

    return grader.grade_main(args)


def _doctor(args: argparse.Namespace) -> int:
    from ddp_lab import doctor

    return doctor.main(args)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddp-lab", description=__doc__)
    parser.add_argument("--lang", choices=["en", "zh"], help="language of messages")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="generate notebooks, exercises and solutions from chapters/")
    p.add_argument("chapters", nargs="*", help="chapter prefixes, e.g. 00 03 (default: all)")
    p.add_argument("--check", action="store_true", help="only report stale generated files")
    p.set_defaults(func=_build)

    p = sub.add_parser("check", help="run your exercise notebook and show the points")
    p.add_argument("notebook")
    p.add_argument("--cell-timeout", type=float, default=300)
    p.add_argument("--timeout", type=float, default=1800)
    p.set_defaults(func=_check)

    p = sub.add_parser("grade", help="grade submissions against a released exercise notebook")
    p.add_argument("--release", required=True, help="the released exercise notebook")
    p.add_argument("submissions", nargs="+", help="submission notebooks or folders")
    p.add_argument("--out", default=".", help="where the gradebook and feedback go")
    p.add_argument("--cell-timeout", type=float, default=300)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--jobs", type=int, default=0, help="parallel gradings (default: cores)")
    p.set_defaults(func=_grade)

    p = sub.add_parser("doctor", help="check the GPU driver, CUDA, PyTorch and NCCL setup")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if args.lang:
        from ddp_lab.course.i18n import set_language

        set_language(args.lang)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
