#!/usr/bin/env bash
# Install the course into ./.venv and open it in JupyterLab.
#   bash setup.sh              install (idempotent) and start JupyterLab on the course
#   bash setup.sh --no-lab     install only
# TORCH_SPEC overrides the torch requirement (default: torch==2.13.0; pip picks the build for
# this machine: a CUDA build on Linux x86_64 from PyPI, a CPU build where the index serves one).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10+ is needed / 需要 Python 3.10 或更新版本"'
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first, pinned: an unpinned torch would pull a multi-GB build that may not match.
"$VPY" -c 'import torch' 2>/dev/null || "$VPY" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
extras=${DDP_LAB_EXTRAS:-course}
"$VPY" -m pip install -q -e ".[$extras]"
"$VPY" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ddp-lab)" >/dev/null
# `ddp-lab grade` runs each submission in a bubblewrap sandbox (docs/INSTRUCTORS.md).
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends bubblewrap \
      >/dev/null 2>&1 || echo "setup.sh: could not install bubblewrap; grading will not be sandboxed" >&2
  else
    echo "setup.sh: instructors: install bubblewrap (e.g. sudo apt-get install bubblewrap) so" \
      "that ddp-lab grade sandboxes submissions / 教师请安装 bubblewrap 以隔离评分" >&2
  fi
fi
if [ "${1:-}" != "--no-lab" ]; then
  exec .venv/bin/jupyter lab --notebook-dir="$PWD" notebooks/
fi
