#!/usr/bin/env bash
# The course on one GPU: every lesson and solution notebook, the straight/killed/resumed
# training pair (sha256 compared), `pytest -m gpu` and the unit tests that touch CUDA; one
# summary at the end. Installs nothing from the network: a machine with a GPU may have none.
#
#   bash benchmarks/gpu_wheels.sh             # here, with the network: the wheels, into .whl
#   WHEELS=.whl OUT=/path/to/logs bash benchmarks/gpu_check.sh      # there
#
# With the device tool (docs/gpu-verified.md has the call): carry [".whl"], command
# `WHEELS=.whl bash benchmarks/gpu_check.sh`, timeout_s 600. The device time is short
# (15 minutes a session, the machine's start included), so the whole check has a budget,
# BUDGET_S (default 480 s): every step is cut at what is left of it, and a cut step says so in
# the summary. The steps overlap: the notebooks run in the background from the start (JOBS at
# once, slowest first), the GPU steps in the foreground, then the unit tests.
#
# Environment:
#   WHEELS   wheels the machine lacks (benchmarks/gpu_wheels.sh makes them), installed with
#            pip --no-index --no-deps into a folder of their own; the machine's torch is used
#            as it is.
#   OUT      where the logs go (default ./gpu-check-<date>); at most 8 files, each written as
#            its step ends (the device tool returns 8 files, and a run cut short still returns
#            what it wrote): summary.txt, setup.log, train.log, gpu_tests.log, unit.log,
#            notebooks.log (each notebook's nbval output, appended as it ends), details.tar.gz.
#   JOBS     notebooks at once (default: cores / 2, at most 8).
#   LANGS    the notebooks' languages (default "en"; the code cells of zh are the same).
#   BACKEND  the training pair's backend (default nccl). BACKEND=gloo on a machine without a GPU
#            rehearses the script itself (docs/gpu-verified.md, "rehearsal").
#   PYTHON   the interpreter (default: setup.sh's .venv where there is one, else python3).
# Record each run in docs/gpu-verified.md: GPU, driver, torch, date, what passed.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(realpath -m "${OUT:-$PWD/gpu-check-$(date +%Y%m%d-%H%M%S)}")
WHEELS=${WHEELS:+$(realpath -m "$WHEELS")}
BUDGET_S=${BUDGET_S:-480}
BACKEND=${BACKEND:-nccl}
JOBS=${JOBS:-$(( $(nproc) / 2 > 8 ? 8 : ($(nproc) / 2 > 0 ? $(nproc) / 2 : 1) ))}
PY=${PYTHON:-$( [ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3 )}
T0=$(date +%s)
export DEADLINE=$((T0 + BUDGET_S))
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ddp_lab_gpu_check.XXXXXX")
mkdir -p "$WORK/nb"
NB_PID=
finish() {
  [ -n "$NB_PID" ] && kill -- -"$NB_PID" 2>/dev/null
  tar -czf "$OUT/details.tar.gz" -C "$WORK" nb train 2>/dev/null
  rm -rf "$WORK"
}
trap finish EXIT
# Lessons show the cluster labs' stored runs (as in test.sh): those labs run on CPU ranks in
# network namespaces, which a GPU changes nothing about, and they take minutes.
export PYTHONUNBUFFERED=1 MPLBACKEND=agg TMPDIR="$WORK" DDP_LAB_STORED_RUNS=1
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$1" | tee -a "$SUMMARY"; }
step() { echo; echo "##### [$(( $(date +%s) - T0 ))s] $*"; }
# left CAP: seconds a step may take: CAP, or less where the budget has less left.
left() { local t=$((DEADLINE - $(date +%s))); echo $(( t < $1 ? t : $1 )); }
export -f left  # for the notebooks' shells
# within CAP CMD...: CMD cut at left CAP; 124 (timeout's code) where nothing is left.
within() { local t; t=$(left "$1"); shift; [ "$t" -ge 5 ] || return 124; timeout -k 5 "$t" "$@"; }
verdict() { case $1 in 0) echo PASS ;; 124|137) echo "FAIL (cut at the budget)" ;; *) echo FAIL ;; esac; }

step install
{ # a group, not a subshell: the exports below hold for the whole check
  if [ -n "$WHEELS" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WHEELS"/*.whl \
      || echo "FAIL install"
  fi
  export PYTHONPATH="$WORK/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PATH="$WORK/site/bin:$PATH"
  export JUPYTER_PATH="$WORK/kp/share/jupyter"
  "$PY" -m ipykernel install --prefix "$WORK/kp" --name python3
  # The course is not installed (PYTHONPATH has it): its command, for the tests that call it.
  mkdir -p "$WORK/site/bin"
  printf '#!/bin/sh\nexec %s -m ddp_lab.course.cli "$@"\n' "$PY" > "$WORK/site/bin/ddp-lab"
  chmod +x "$WORK/site/bin/ddp-lab"
} > "$OUT/setup.log" 2>&1
grep -q "^FAIL install" "$OUT/setup.log" && note "FAIL install (setup.log)"
TORCHRUN=$(command -v torchrun || echo "$PY -m torch.distributed.run")

step notebooks   # in the background from the start: they take longest
# Slowest first (as the rehearsal measured them), so the last to start are short ones; then
# any notebook SLOW does not name.
set -m   # the notebooks' job gets a process group of its own: finish() ends all of it
SLOW="10_ 11_ 09_ 07_ 05_ 08_ 04_ 12_ 03_ 06_ 02_ 00_ 01_"
(
  cd "$ROOT"
  { for p in $SLOW; do for l in ${LANGS:-en}; do ls notebooks/"$l"/$p*.ipynb solutions/"$l"/$p*.ipynb; done; done
    for l in ${LANGS:-en}; do ls notebooks/"$l"/*.ipynb solutions/"$l"/*.ipynb; done; } 2>/dev/null \
    | awk '!seen[$0]++' | xargs -P "$JOBS" -I{} bash -c '
      nb={}; name=$(echo "$nb" | tr / _); log="$1/nb/$name.log"
      t=$(left 600)
      if [ "$t" -lt 10 ]; then echo "rc=cut (no time left to start)" > "$log"; else
        timeout -k 5 "$t" "$2" -m pytest -p no:cacheprovider -q -rfE --nbval-lax -p ddp_lab.course.nbtraces \
          --nbval-cell-timeout=300 "$nb" > "$log" 2>&1
        printf "\nrc=%s\n" "$?" >> "$log"; fi
      flock "$3" -c "{ echo \"===== $nb\"; cat \"$log\"; } >> \"$3\""' _ "$WORK" "$PY" "$OUT/notebooks.log"
) &
NB_PID=$!
set +m

step facts
{ nvidia-smi; "$PY" -c "import platform, torch; print('python', platform.python_version(),
  'torch', torch.__version__, 'CUDA', torch.version.cuda,
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU',
  'NCCL', torch.cuda.nccl.version() if torch.cuda.is_available() else '-')"; } >> "$OUT/setup.log" 2>&1
note "facts: $(tail -1 "$OUT/setup.log")"
within 60 "$PY" -m ddp_lab.course.cli doctor > "$WORK/doctor.log" 2>&1
rc=$?
cat "$WORK/doctor.log" >> "$OUT/setup.log"
note "doctor rc=$rc ($(grep -c '^\[WARNING\]\|^\[PROBLEM\]' "$WORK/doctor.log") warnings/problems; setup.log)"

step training_pair   # straight twice and killed at step 25 then resumed: the same sha256
mkdir -p "$WORK/train" && cd "$WORK/train"
TR="$TORCHRUN --standalone --nproc-per-node 1 -m ddp_lab.tools.train --backend $BACKEND --epochs 2 --quiet --deterministic --checkpoint-every 10"
sha() { grep -o 'final parameters sha256 [0-9a-f]*' "$1" | tail -1 | cut -d' ' -f4; }
within 120 $TR --checkpoint-dir ck1 > straight.log 2>&1; r1=$?
within 120 $TR --checkpoint-dir ck2 > straight2.log 2>&1; r2=$?
within 150 $TORCHRUN --standalone --max-restarts=1 --nproc-per-node 1 -m ddp_lab.tools.train \
  --backend "$BACKEND" --epochs 2 --quiet --deterministic --checkpoint-every 10 --checkpoint-dir ck3 \
  --fail-at-step 25 > resumed.log 2>&1; r3=$?
for f in straight straight2 resumed; do { echo "===== $f"; cat $f.log; } >> "$OUT/train.log"; done
A=$(sha straight.log); B=$(sha straight2.log); C=$(sha resumed.log)
# The resumed run must have lost its worker (torchrun: "failed (exitcode: -9)") and restarted.
if [[ " $r1 $r2 $r3 " =~ \ (124|137)\  ]]; then
  note "FAIL (cut at the budget) training pair ($BACKEND): rc $r1 $r2 $r3 (train.log)"
elif ! grep -q "failed (exitcode" resumed.log; then
  note "FAIL training pair ($BACKEND): the resumed run shows no killed worker (train.log)"
elif [ -n "$A" ] && [ "$A" = "$B" ] && [ "$A" = "$C" ]; then
  note "PASS training pair ($BACKEND): straight = straight again = resumed = $A"
else note "FAIL training pair ($BACKEND): straight=${A:-none} again=${B:-none} resumed=${C:-none} (train.log)"; fi
cd "$ROOT"

# Where pytest-xdist is installed (the GPU machine's image has it), the unit tests share
# the cores with the notebooks in a few workers; each file stays in one worker.
XDIST=()
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n 4 --dist loadfile)

step gpu_tests   # the training pair above is the nccl resume test's own run: not run twice
# Only the files that hold gpu tests: collecting all of tests/ takes minutes, and some of its
# modules import what the check does not carry (babel).
mapfile -t GPU_FILES < <(grep -rl --include='test_*.py' 'mark\.gpu' tests | sort)
within 240 "$PY" -m pytest -p no:cacheprovider -q -rfEs -m gpu "${XDIST[@]}" "${GPU_FILES[@]}" \
  -k "not nccl_resumed_run_equals" > "$OUT/gpu_tests.log" 2>&1
note "$(verdict $?) pytest -m gpu: $(tail -1 "$OUT/gpu_tests.log")"

step unit_tests   # -rfE names what failed; the gpu tests ran above
within "$BUDGET_S" "$PY" -m pytest -p no:cacheprovider -q -rfE -m "not gpu" "${XDIST[@]}" \
  tests/test_cuda_compat.py tests/test_doctor.py tests/test_train.py tests/test_resume.py \
  tests/test_resume_device.py tests/test_ddp.py tests/test_fsdp.py tests/test_zero.py \
  tests/test_comm_hooks.py tests/test_collectives.py tests/test_bucketed_ddp.py \
  tests/test_trace_analysis.py tests/test_one_gpu_lessons.py tests/test_torch_versions.py \
  tests/runtime/test_device.py tests/runtime/test_launcher.py tests/runtime/test_persistent.py \
  tests/runtime/test_magic.py tests/runtime/test_trace.py tests/test_tensor_parallel.py \
  > "$OUT/unit.log" 2>&1
note "$(verdict $?) unit tests: $(tail -1 "$OUT/unit.log")"
grep -E '^(FAILED|ERROR)' "$OUT/unit.log" | head -40 >> "$SUMMARY"

step wait_notebooks
while kill -0 "$NB_PID" 2>/dev/null && [ "$(date +%s)" -lt $((DEADLINE + 10)) ]; do sleep 2; done
kill -- -"$NB_PID" 2>/dev/null && sleep 2
NB_PID=
passed=0; failed=(); cut=()
cd "$ROOT"
for l in ${LANGS:-en}; do for nb in notebooks/"$l"/*.ipynb solutions/"$l"/*.ipynb; do
  log="$WORK/nb/$(echo "$nb" | tr / _).log"
  if grep -q '^rc=0$' "$log" 2>/dev/null; then passed=$((passed + 1))
  elif ! grep -q '^rc=' "$log" 2>/dev/null || grep -q '^rc=\(124\|137\|143\|cut\)' "$log"; then
    cut+=("$nb")  # timed out, killed at the end, or never started
  else failed+=("$nb"); fi
done; done
note "notebooks: $passed passed, ${#failed[@]} failed${failed[*]:+: ${failed[*]}}"
[ ${#cut[@]} = 0 ] || note "FAIL notebooks cut at the budget or not started: ${cut[*]}"

step summary
echo "================ SUMMARY ($(( $(date +%s) - T0 ))s of $BUDGET_S; logs in $OUT) ================"
cat "$SUMMARY"
! grep -q '^FAIL\|failed: ' "$SUMMARY"
