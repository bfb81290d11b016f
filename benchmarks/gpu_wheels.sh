#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh needs on a GPU machine that has no network: every package
# the course and its tests need that the machine's Python lacks, for that machine's Python and
# platform, downloaded here into one folder that travels with the check.
#
#   bash benchmarks/gpu_wheels.sh [DEST]          # default DEST: .whl (ignored by git)
#
# PY_VERSION (default 3.12) and the platform tags are the GPU machine's (Python 3.12.3, x86-64,
# glibc >= 2.28). HAVE lists what that machine's image already holds (the device library's
# KINDS.md, "Python packages already there"); those are left out, so the folder stays small
# (a few MiB rather than the ~100 MiB numpy, scipy and scikit-learn would add) and the machine's
# own builds (its torch above all) are the ones that run. mplfonts (the Chinese font, 17 MiB)
# is left out: the check runs the en notebooks, and the course draws without it.
# Why not `pip download -r`: pip resolves the whole tree, torch and CUDA's wheels included;
# here it resolves (`--dry-run --report`, no download) and then fetches only what is missing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=$(realpath -m "${1:-$ROOT/.whl}")
PY_VERSION=${PY_VERSION:-3.12}
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_17_x86_64
  manylinux2014_x86_64 manylinux_2_12_x86_64 manylinux2010_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64)
HAVE=${HAVE:-"attrs certifi cloudpickle contourpy coverage cycler filelock fonttools fsspec hypothesis
  idna iniconfig jinja2 joblib kiwisolver markdown-it-py markupsafe matplotlib mdurl narwhals
  networkx numpy packaging pillow pluggy psutil pygments pyparsing pytest pytest-timeout
  pytest-xdist execnet python-dateutil pyyaml scikit-learn scipy six sortedcontainers sympy
  mpmath threadpoolctl torch tqdm typing-extensions setuptools triton"}
SKIP=${SKIP:-"torch mplfonts"}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The course's dependencies (pyproject.toml) and the test tools the check's tests use.
python3 - "$ROOT/pyproject.toml" "$SKIP" > "$work/req.txt" <<'EOF'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
skip = set(sys.argv[2].split())
for d in deps + ["pytest>=8.0", "pytest-timeout>=2.2", "hypothesis>=6.90"]:
    if re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower() not in skip:
        print(d)
EOF
tags=(--only-binary=:all: --python-version "$PY_VERSION" --implementation cp)
for p in "${PLATFORMS[@]}"; do tags+=(--platform "$p"); done
python3 -m pip install -q --dry-run --ignore-installed --report "$work/report.json" "${tags[@]}" \
  --target "$work/t" -r "$work/req.txt" 2> >(grep -v "^WARNING: Location" >&2)
python3 - "$work/report.json" "$HAVE" > "$work/missing.txt" <<'EOF'
import json, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {norm(n) for n in sys.argv[2].split()}
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    if norm(meta["name"]) not in have:
        print(f"{meta['name']}=={meta['version']}")
EOF
rm -rf "$DEST" && mkdir -p "$DEST"
python3 -m pip download -q --no-deps "${tags[@]}" -d "$DEST" -r "$work/missing.txt" \
  2> >(grep -v "^WARNING: Location" >&2)
echo "$(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1), in $DEST (for Python $PY_VERSION):"
ls "$DEST" | sed 's/-py[23].*\|-cp3.*//' | tr '\n' ' '
echo
