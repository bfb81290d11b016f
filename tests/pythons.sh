#!/usr/bin/env bash
# The package on Pythons other than the one test.sh runs on. pyproject.toml says
# requires-python >= 3.10; test.sh's .venv has one Python (CI's: 3.11), and what changes
# between versions (traceback's hooks, audit events, _posixsubprocess, ctypes) only
# shows on the others: before this check, `import ddp_lab` failed on 3.10 and a rank's
# exception lost its traceback on 3.13.
#
#   bash tests/pythons.sh 3.10 3.13        # each: a venv, torch, the course, the tests below
#   bash tests/pythons.sh --install 3.10   # the venvs only, for a later run (test.sh)
#
# For each version it finds python3.X on PATH, else under pyenv ($PYENV_ROOT/versions/3.X.*,
# the newest), and installs the course with setup.sh into a venv in build/pythons/3.X
# (PYTHONS_DIR): torch (TORCH_SPEC, TORCH_INDEX_URL as setup.sh reads them: from PyPI on Linux
# x86_64 the CUDA build, several GB), the course and its test extra, the notebooks' kernel. So
# this also checks what the README tells a learner with another Python. A version not found is
# reported and skipped. The venv is removed afterwards (it holds GBs) unless KEEP=1. test.sh
# runs this when DDP_LAB_PYTHONS names versions (CI's .ci/run does); it prints one summary line
# a version.
#
# The tests: what depends on the Python version, not the whole suite (test.sh runs that).
#   - the launcher, its tracebacks and cell names, the magics (tests/runtime);
#   - the grading guard (audit hook, fork_exec, ctypes) and the sandbox;
#   - chapter 00 as a learner runs it, in a kernel of that Python (nbval).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIR=${PYTHONS_DIR:-$ROOT/build/pythons}  # the venvs and their logs
TESTS=(tests/runtime/test_launcher.py tests/runtime/test_stable_names.py
  tests/runtime/test_magic.py tests/course/test_grading_guard.py tests/course/test_sandbox.py
  tests/test_i18n.py notebooks/en/00_quickstart.ipynb)
export PIP_DISABLE_PIP_VERSION_CHECK=1 MPLBACKEND=agg DDP_LAB_STORED_RUNS=1
unset DDP_LAB_LANG
status=0
summary=()

# The first that runs and is that version: python3.X on PATH (a pyenv shim on PATH may name a
# version pyenv does not select, and fails), else the newest $PYENV_ROOT/versions/3.X.*.
find_python() {
  local v=$1 p
  for p in $(command -v "python$v" 2>/dev/null) \
    $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$v".*/bin/python 2>/dev/null | sort -V -r); do
    if "$p" -c "import sys; sys.exit(f'{sys.version_info[0]}.{sys.version_info[1]}' != '$v')" \
      2>/dev/null; then
      echo "$p"
      return
    fi
  done
  return 1
}

# --install: only install each version's venv, and leave it ready ($DIR/3.X.ready: the install's
# seconds) for a later run without --install, which then runs the tests on it. test.sh starts
# this at its beginning at the lowest priority, while the grading tests run alone and leave part
# of the CPU idle: the install (GBs to unpack) was the larger part of this check, on the
# critical path at the end of the run.
install_only=0
if [ "${1:-}" = --install ]; then
  install_only=1
  shift
fi

# Installed as a learner installs (README: `PYTHON=python3.12 bash setup.sh`), with the test
# extra. PIP_COMPILE=0: no .pyc for torch's thousands of files up front (a minute of the
# install; pip reads PIP_NO_COMPILE=1 as "compile"); Python writes those it imports, and the
# import below writes those of what a rank imports, once: without them two ranks of the first
# launches each compiled torch's modules.
install() {  # VERSION PYTHON VENV LOG: 0 when the venv is ready
  local v=$1 py=$2 venv=$3 log=$4 t0
  if [ -f "$DIR/$v.ready" ] && [ -x "$venv/bin/python" ]; then
    echo "(installed before the tests, in $(cat "$DIR/$v.ready") s)" >>"$log"
    return 0
  fi
  rm -f "$DIR/$v.ready"
  t0=$(date +%s)
  # pip's temporary files (GBs of wheels while it unpacks) beside the venv, not in /tmp: the
  # grading tests that run meanwhile count what appears in the temporary folders.
  mkdir -p "$DIR/tmp-$v"
  TMPDIR=$DIR/tmp-$v PYTHON=$py VENV=$venv DDP_LAB_EXTRAS=test PIP_COMPILE=0 \
    bash setup.sh --no-lab >"$log" 2>&1 &&
    "$venv/bin/python" -c 'import torch, torch.distributed, ddp_lab.runtime' >>"$log" 2>&1 &&
    echo "$(($(date +%s) - t0))" >"$DIR/$v.ready"
  local rc=$?
  rm -rf "$DIR/tmp-$v"
  return $rc
}

for v in "$@"; do
  if ! py=$(find_python "$v"); then
    summary+=("python $v: SKIPPED, not found (python$v on PATH or pyenv's versions/$v.*)")
    continue
  fi
  venv=$DIR/$v
  log=$DIR/$v.log
  mkdir -p "$DIR"
  if [ "$install_only" = 1 ]; then
    echo "--- python $v: installing $py into $venv (log: $log) ---"
    install "$v" "$py" "$venv" "$log" || { tail -n 20 "$log"; status=1; }
    continue
  fi
  echo "--- python $v: $py -> $venv (log: $log) ---"
  if ! install "$v" "$py" "$venv" "$log"; then
    tail -n 20 "$log"
    summary+=("python $v: FAILED to install (log: $log)")
    status=1
  else
    t0=$(date +%s)
    version=$("$venv/bin/python" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)')
    "$venv/bin/python" -m pytest -p no:cacheprovider -q --nbval-lax --nbval-cell-timeout=300 \
      -p ddp_lab.course.nbtraces "${TESTS[@]}" 2>&1 | tee -a "$log" | tail -n 15
    rc=${PIPESTATUS[0]}
    result=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$log" | tail -n 1 | tr -d '=')
    took="the install: $(cat "$DIR/$v.ready") s, the tests: $(($(date +%s) - t0)) s"
    if [ "$rc" -eq 0 ]; then
      summary+=("python $v ($version): PASSED: ${result# } ($took)")
    else
      summary+=("python $v ($version): FAILED (rc $rc): ${result# } (log: $log)")
      status=1
    fi
  fi
  # the mark is for the run after --install only: a venv kept (KEEP=1) goes through setup.sh
  # again next time, as it always did (idempotent), and takes the course's new dependencies
  rm -f "$DIR/$v.ready"
  [ "${KEEP:-0}" = 1 ] || rm -rf "$venv"
done
[ "$install_only" = 1 ] && exit "$status"
echo "--- other Pythons ---"
printf '%s\n' "${summary[@]}"
exit "$status"
