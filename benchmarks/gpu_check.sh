#!/usr/bin/env bash
# The course on one GPU: every lesson and solution notebook, the straight/killed/resumed
# training pair (sha256 compared), `pytest -m gpu` and the unit tests that touch CUDA; one
# summary at the end. Installs nothing from the network: a machine with a GPU may have none.
#
#   WHEELS=/path/to/wheels OUT=/path/to/logs bash benchmarks/gpu_check.sh
#
# WHEELS (optional): wheels the machine lacks (ipykernel, nbval, nbclient, nbformat, orjson,
#   ... and their dependencies), installed with pip --no-index --no-deps into a folder of
#   their own (the machine's torch is used as it is). OUT: where the logs go (default
#   ./gpu-check-<date>); every step writes its log there as it ends, so a run cut short
#   still leaves what it did. JOBS: notebooks run at once (default: cores / 4, at least 1).
#   LANGS: the notebooks' languages (default "en"; the code cells of zh are the same).
# Record each run in docs/gpu-verified.md: GPU, driver, torch, date, what passed.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$PWD/gpu-check-$(date +%Y%m%d-%H%M%S)}
JOBS=${JOBS:-$(( $(nproc) / 4 > 0 ? $(nproc) / 4 : 1 ))}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ddp_lab_gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export PYTHONUNBUFFERED=1 MPLBACKEND=agg TMPDIR="$WORK"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
T0=$(date +%s)
note() { echo "$1" | tee -a "$SUMMARY"; }
step() { echo; echo "##### [$(( $(date +%s) - T0 ))s] $*"; }

step install
if [ -n "${WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$WHEELS"/*.whl \
    > "$OUT/install.log" 2>&1 || note "FAIL install (see install.log)"
  export PYTHONPATH="$WORK/site:$ROOT" PATH="$WORK/site/bin:$PATH" JUPYTER_PATH="$WORK/kp/share/jupyter"
  "$PY" -m ipykernel install --prefix "$WORK/kp" --name python3 >> "$OUT/install.log" 2>&1
else
  export PYTHONPATH="$ROOT"
fi
TORCHRUN=$(command -v torchrun || echo "$PY -m torch.distributed.run")

step facts
{ nvidia-smi; "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda,
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU',
  'NCCL', torch.cuda.nccl.version() if torch.cuda.is_available() else '-')"; } > "$OUT/facts.log" 2>&1
cat "$OUT/facts.log" | tail -1
note "facts: $(tail -1 "$OUT/facts.log")"
"$PY" -m ddp_lab.course.cli doctor > "$OUT/doctor.log" 2>&1
note "doctor rc=$? ($(grep -c '^\[WARNING\]\|^\[PROBLEM\]' "$OUT/doctor.log") warnings/problems; doctor.log)"

step notebooks   # in the background: they take longest
mkdir -p "$OUT/notebooks"
( cd "$ROOT" && for l in ${LANGS:-en}; do ls notebooks/"$l"/*.ipynb solutions/"$l"/*.ipynb; done | xargs -P "$JOBS" -I{} bash -c '
    nb={}; log="$0/$(echo "$nb" | tr / _).log"
    timeout 900 '"$PY"' -m pytest -p no:cacheprovider -q -rfE --nbval-lax --nbval-cell-timeout=300 "$nb" > "$log" 2>&1
    echo "rc=$?" >> "$log"' "$OUT/notebooks" ) &
NB_PID=$!

step training_pair   # straight twice and killed at step 25 then resumed: the same sha256
cd "$WORK"
TR="$TORCHRUN --standalone --nproc-per-node 1 -m ddp_lab.tools.train --backend nccl --epochs 2 --quiet --deterministic --checkpoint-every 10"
sha() { grep -o 'final parameters sha256 [0-9a-f]*' "$1" | tail -1 | cut -d' ' -f4; }
timeout 300 $TR --checkpoint-dir "$WORK/ck1" > "$OUT/train_straight.log" 2>&1
timeout 300 $TR --checkpoint-dir "$WORK/ck2" > "$OUT/train_straight2.log" 2>&1
timeout 300 $TORCHRUN --standalone --max-restarts=1 --nproc-per-node 1 -m ddp_lab.tools.train --backend nccl \
  --epochs 2 --quiet --deterministic --checkpoint-every 10 --checkpoint-dir "$WORK/ck3" --fail-at-step 25 \
  > "$OUT/train_resumed.log" 2>&1
A=$(sha "$OUT/train_straight.log"); B=$(sha "$OUT/train_straight2.log"); C=$(sha "$OUT/train_resumed.log")
if [ -n "$A" ] && [ "$A" = "$B" ] && [ "$A" = "$C" ]; then note "PASS training pair: straight = straight again = resumed = $A"
else note "FAIL training pair: straight=${A:-none} again=${B:-none} resumed=${C:-none} (train_*.log)"; fi
cd "$ROOT"

step gpu_tests
timeout 900 "$PY" -m pytest -p no:cacheprovider -q -rfEs -m gpu tests > "$OUT/pytest_gpu.log" 2>&1
note "$( [ $? = 0 ] && echo PASS || echo FAIL ) pytest -m gpu: $(tail -1 "$OUT/pytest_gpu.log")"

step wait_notebooks
wait "$NB_PID"
passed=0; failed=()
for log in "$OUT"/notebooks/*.log; do
  if grep -q '^rc=0$' "$log"; then passed=$((passed + 1)); else failed+=("$(basename "$log" .log)"); fi
done
note "notebooks: $passed passed, ${#failed[@]} failed${failed[*]:+: ${failed[*]}}"

step unit_tests   # the tests that touch CUDA, with the cores to themselves; -rfE names failures
timeout 1200 "$PY" -m pytest -p no:cacheprovider -q -rfE \
  tests/test_cuda_compat.py tests/test_doctor.py tests/test_train.py tests/test_resume.py \
  tests/test_resume_device.py tests/test_ddp.py tests/test_fsdp.py tests/test_zero.py \
  tests/test_comm_hooks.py tests/test_collectives.py tests/test_bucketed_ddp.py \
  tests/test_trace_analysis.py tests/test_one_gpu_lessons.py tests/test_torch_versions.py \
  tests/runtime/test_device.py tests/runtime/test_launcher.py tests/runtime/test_persistent.py \
  tests/runtime/test_magic.py tests/runtime/test_trace.py > "$OUT/unit.log" 2>&1
note "$( [ $? = 0 ] && echo PASS || echo FAIL ) unit tests: $(tail -1 "$OUT/unit.log")"
grep -E '^(FAILED|ERROR)' "$OUT/unit.log" | head -40 >> "$SUMMARY"

step summary
echo "================ SUMMARY ($(( $(date +%s) - T0 ))s; logs in $OUT) ================"
cat "$SUMMARY"
! grep -q '^FAIL\|failed: ' "$SUMMARY"
