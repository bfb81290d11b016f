#!/usr/bin/env bash
# Install the course into ./.venv (or $VENV) and open it in JupyterLab.
#   bash setup.sh                  install (idempotent) and start JupyterLab on the course
#   bash setup.sh --no-lab         install only
#   bash setup.sh --lab [ARGS]     start JupyterLab again, without checking the install (seconds)
#   bash setup.sh [JUPYTER ARGS]   other arguments go to `jupyter lab` (e.g. --no-browser --port 8899)
# Where packages come from (README, "Setup"):
#   TORCH_INDEX_URL  the index torch comes from, e.g. PyTorch's CPU wheels (no multi-GB CUDA
#                    build on a laptop without a GPU): https://download.pytorch.org/whl/cpu
#   TORCH_SPEC       the torch requirement (default torch==2.13.0), e.g. a CUDA build that
#                    matches your driver (chapter 01, `ddp-lab doctor`)
#   PIP_INDEX_URL    pip's own variable, for everything else: a PyPI mirror, e.g. in mainland
#                    China https://pypi.tuna.tsinghua.edu.cn/simple
#   PYTHON           the Python that creates the venv (default python3), e.g. python3.12
#   VENV             where the venv goes (default .venv in the course folder), e.g. one venv
#                    per Python: PYTHON=python3.12 VENV=.venv-3.12 bash setup.sh
set -euo pipefail
# VENV as the caller meant it: a relative path is relative to where setup.sh was started.
if [ -n "${VENV:-}" ] && [ "${VENV#/}" = "$VENV" ]; then VENV=$PWD/$VENV; fi
cd "$(dirname "$0")"
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10+ is needed / 需要 Python 3.10 或更新版本"'
VPY=$VENV/bin/python
start_only=0
if [ "${1:-}" = "--lab" ]; then
  shift
  if [ -x "$VENV/bin/jupyter" ] && "$VPY" -c 'import ddp_lab' 2>/dev/null; then
    start_only=1
  else
    echo "setup.sh: --lab: nothing installed yet, installing first / 尚未安装，先安装" >&2
  fi
fi
if [ "$start_only" = 0 ]; then
[ -x "$VPY" ] || "$PY" -m venv "$VENV"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ -n "${PIP_INDEX_URL:-}" ]; then
  echo "setup.sh: packages from PIP_INDEX_URL=$PIP_INDEX_URL / 从该镜像安装软件包" >&2
fi
# torch first, pinned: an unpinned torch would pull a multi-GB build that may not match.
if ! "$VPY" -c 'import torch' 2>/dev/null; then
  torch_args=()
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    torch_args=(--index-url "$TORCH_INDEX_URL")
    echo "setup.sh: torch from TORCH_INDEX_URL=$TORCH_INDEX_URL / 从该索引安装 torch" >&2
  else
    echo "setup.sh: installing ${TORCH_SPEC:-torch==2.13.0} (on Linux x86_64 from PyPI: the" \
      "CUDA build, several GB). No GPU? TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" \
      "bash setup.sh; slow downloads: README, \"Mirrors\" /" \
      "没有 GPU：用上面的 TORCH_INDEX_URL 安装 CPU 版；下载慢：见 README 的“镜像”一节" >&2
  fi
  # Not -q: the CUDA build is several GB, and pip's download lines are the only progress.
  if ! "$VPY" -m pip install --progress-bar on ${torch_args[@]+"${torch_args[@]}"} \
      "${TORCH_SPEC:-torch==2.13.0}"; then
    index=${TORCH_INDEX_URL:-${PIP_INDEX_URL:-https://pypi.org/simple}}
    echo "" >&2
    echo "setup.sh: torch could not be installed from $index. If pip said ResolutionImpossible" \
      "or 'No matching distribution', the index was probably not reachable (network, proxy" \
      "or firewall): try 'curl -sI $index' or 'pip download torch --no-deps -d /tmp/x -v'." \
      "Alternatives: another index (unset TORCH_INDEX_URL for PyPI's CUDA build; a mirror" \
      "with PIP_INDEX_URL, README \"No GPU, or a slow network\"), or a wheel you downloaded" \
      "elsewhere: TORCH_SPEC=/path/to/torch-2.13.0-...whl bash setup.sh /" \
      "无法从 $index 安装 torch。如果 pip 报 ResolutionImpossible 或 No matching distribution，" \
      "多半是连不上这个索引（网络、代理或防火墙）：可以先试 curl -sI $index。其他办法：换一个索引" \
      "（去掉 TORCH_INDEX_URL 用 PyPI 的 CUDA 版；用 PIP_INDEX_URL 指定镜像，见 README），或用在别处" \
      "下载好的 wheel：TORCH_SPEC=/path/to/torch-2.13.0-...whl bash setup.sh" >&2
    exit 1
  fi
fi
extras=${DDP_LAB_EXTRAS:-course}
"$VPY" -m pip install -q -e ".[$extras]"
# ipykernel stages the spec in a temporary folder and leaves that folder's parent behind
# (an empty /tmp/tmp*_kernels per run): give it a folder of ours to remove.
kernel_tmp=$(mktemp -d)
TMPDIR="$kernel_tmp" \
  "$VPY" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ddp-lab)" >/dev/null
rm -rf "$kernel_tmp"
# JupyterLab's terminals: a bash that reads the user's bashrc and then activates the venv, so
# that `ddp-lab` works there (jupyter_server starts a login shell by default, and a login
# shell's /etc/profile resets PATH); and a contents manager that keeps the notebooks
# unmodified on open. Any `$VENV/bin/jupyter` reads $VENV/etc/jupyter.
venv=$(cd "$VENV" && pwd)
mkdir -p "$venv/etc/jupyter" "$venv/etc/ddp-lab"
cat >"$venv/etc/ddp-lab/bashrc" <<EOF
# Written by setup.sh: the rc file of bash in JupyterLab's terminals.
[ -f /etc/bash.bashrc ] && . /etc/bash.bashrc
[ -f ~/.bashrc ] && . ~/.bashrc
. "$venv/bin/activate"
EOF
"$VPY" - "$venv" <<'EOF'
import json, os, shutil, sys
venv = sys.argv[1]
path = f"{venv}/etc/jupyter/jupyter_server_config.json"
config = json.load(open(path)) if os.path.exists(path) else {}
shell = [shutil.which("bash") or "/bin/bash", "--rcfile", f"{venv}/etc/ddp-lab/bashrc", "-i"]
server = config.setdefault("ServerApp", {})
server.setdefault("terminado_settings", {})["shell_command"] = shell
# Notebooks open unmodified (ddp_lab/course/lab_contents.py).
server["contents_manager_class"] = "ddp_lab.course.lab_contents.CourseContentsManager"
with open(path, "w") as f:
    json.dump(config, f, indent=2)
EOF
# `ddp-lab grade` runs each submission in a bubblewrap sandbox (docs/INSTRUCTORS.md), and counts
# the bytes 05.ring's ranks send each other with ss (iproute2; course/grading/traffic.py).
if ! command -v bwrap >/dev/null || ! command -v ss >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt_bwrap() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends bubblewrap iproute2; }
    { apt_bwrap || { apt-get update -q && apt_bwrap; }; } >/dev/null 2>&1 ||
      echo "setup.sh: could not install bubblewrap; grading will not be sandboxed" >&2
  else
    echo "setup.sh: instructors: install bubblewrap (e.g. sudo apt-get install bubblewrap) so" \
      "that ddp-lab grade sandboxes submissions / 教师请安装 bubblewrap 以隔离评分" >&2
  fi
fi
again="bash setup.sh --lab"
[ "$VENV" = .venv ] || again="VENV=$VENV $again"
echo "setup.sh: installed. In a shell: source $VENV/bin/activate (then ddp-lab works);" \
  "JupyterLab's terminals do it for you. Next time, start the lab with: $again /" \
  "安装完成。在终端中先运行 source $VENV/bin/activate；JupyterLab 自带的终端已自动激活。" \
  "下次启动 JupyterLab：$again" >&2
fi  # start_only
venv=$(cd "$VENV" && pwd)
if [ "${1:-}" = "--no-lab" ]; then
  exit 0
fi
lab_args=()
if [ "$(id -u)" = 0 ]; then
  echo "setup.sh: running as root (a container or cloud VM?): JupyterLab refuses to start as" \
    "root without --allow-root, so it gets it /" \
    "以 root 运行（容器或云主机？）：JupyterLab 需要 --allow-root 才能启动，已自动加上" >&2
  lab_args+=(--allow-root)
fi
# The venv first on PATH: kernels (`!ddp-lab ...` in a cell) and terminals find its commands.
export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv"
# The whole course is served (exercises/, work/ too); the file browser opens in notebooks/.
# (A folder given as an argument would become the server's root and hide the rest.)
exec "$venv/bin/jupyter" lab --notebook-dir="$PWD" --LabApp.default_url=/lab/tree/notebooks \
  ${lab_args[@]+"${lab_args[@]}"} "$@"
