#!/usr/bin/env bash
# Install what the tests need into ./.venv (idempotent) and run the whole test suite.
#   bash test.sh [extra pytest arguments]
set -euo pipefail
cd "$(dirname "$0")"
DDP_LAB_EXTRAS=test,site bash setup.sh --no-lab
# System packages the tests use, installed when missing and possible (root with apt-get;
# `apt-get update` only when the package lists do not have them):
# - chromium: tests/course/test_browser.py drives JupyterLab in Debian's Chromium (Playwright
#   comes with the test extra); without it the browser tests skip and say why;
# - bubblewrap: `ddp-lab grade` sandboxes each submission with it (course/grading/sandbox.py); without
#   it grading still works, unsandboxed, and the sandbox tests skip and say why.
missing=()
[ -x "${DDP_LAB_CHROMIUM:-/usr/bin/chromium}" ] || missing+=(chromium)
command -v bwrap >/dev/null || missing+=(bubblewrap)
# - iproute2, nftables: tests/cluster/test_hosts.py and chapter 09 build hosts from network namespaces
#   (`ip netns`) and firewall one of them (`nft`); without root they skip and say why. The
#   grader counts 05.ring's bytes with iproute2's `ss` (tests/course/test_grading_attacks_ranks.py).
{ command -v ip >/dev/null && command -v ss >/dev/null; } || missing+=(iproute2)
command -v nft >/dev/null || missing+=(nftables)
# - slurm-wlm, munge: tests/cluster/test_slurm.py and chapter 09 run Slurm on those hosts (slurmctld,
#   one slurmd per host, munged); without them the tests skip and the chapter shows a stored run.
command -v slurmd >/dev/null || missing+=(slurm-wlm)
command -v munged >/dev/null || missing+=(munge)
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt_log=$(mktemp)
  apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  }
  if ! { apt_install || { apt-get update -q && apt_install; }; } >"$apt_log" 2>&1; then
    echo "test.sh: could not install ${missing[*]} (their tests will be skipped):" >&2
    tail -n 5 "$apt_log" >&2
  fi
  rm -f "$apt_log"
fi
unset DDP_LAB_LANG  # each notebook picks its language from its folder
export MPLBACKEND=agg
.venv/bin/ruff check ddp_lab tests benchmarks
# Nothing newer than Python 3.10 (pyproject's requires-python) in the package and the lessons:
# vermin knows when each standard-library name appeared (torch.long is not Python 2's long).
# tests/pythons.sh runs the package on those other Pythons.
.venv/bin/vermin -q --no-tips --violations -t=3.10- --exclude long ddp_lab chapters benchmarks
# DDP_LAB_STORED_RUNS=1: the lessons (both languages) show the stored runs of the cluster labs
# (chapters 04, 09, 11); tests/cluster runs every one of those labs live, once
# (tests/conftest.py unsets the variable there; ddp_lab/cluster/__init__.py).
export DDP_LAB_STORED_RUNS=1
# The nbcache plugin keeps each notebook that ran clean, with its outputs, in build/nb-cache
# (keyed by a hash of the notebook), for the website below.
# The nbtraces plugin fails a cell that shows torch's C++ stack trace where it did not mean to.
# --durations: each run ends with its slowest tests, what to look at when the suite grows.
pytest=(.venv/bin/python -m pytest -p no:cacheprovider --nbval-lax --nbval-cell-timeout=300
  -p ddp_lab.course.nbcache --nb-cache build/nb-cache -p ddp_lab.course.nbtraces --durations=15)
# The solution notebooks without the lesson cells they repeat: notebooks/en runs those
# (tests/solution_cells.py; tests/course/test_solution_cells.py checks that nothing is left out).
.venv/bin/python tests/solution_cells.py build/solutions-en >/dev/null || exit 1
if [ "$#" -gt 0 ]; then
  "${pytest[@]}" tests notebooks build/solutions-en "$@"
  exit
fi
# The other Pythons (DDP_LAB_PYTHONS, below): their venvs (torch's CUDA build from PyPI, GBs to
# unpack) are installed from here on, in the background at the lowest priority, while phase 1
# leaves part of the CPU idle; their tests run in the fourth run of phase 2
# (tests/pythons.sh --install, then tests/pythons.sh on the venvs it left ready).
install=""
if [ -n "${DDP_LAB_PYTHONS:-}" ]; then
  mkdir -p build
  nice -n 19 bash tests/pythons.sh --install $DDP_LAB_PYTHONS >build/pythons-install.log 2>&1 &
  install=$!
fi
# Each run says when it ended (bash's SECONDS: since test.sh started), which the next
# cut of CI's time starts from.
status=0
# 1. Alone: the grading tests that start sandboxes and verdict processes. Some look for
#    leftovers machine-wide (grading's temporary folders, cgroups, sandbox users' processes),
#    the grader's starvation canary reads other runs' load as "the grading machine was too
#    busy", and tests/course/test_browser.py waits on Chromium (the widget chapters in JupyterLab).
#    And tests/test_leak_checks.py, which leaves a /dev/shm file that no process holds for a
#    moment on purpose (what a launch that forgot to unlink leaves): beside it, another run's
#    leak check counted that file as its own (the launcher's tests on 3.10, in CI).
alone=(tests/course/test_grader.py tests/course/test_grading_*.py
  tests/course/test_sandbox.py tests/course/test_export.py tests/course/test_browser.py
  tests/test_leak_checks.py)
"${pytest[@]}" "${alone[@]}" || status=$?
echo "test.sh: phase 1 (alone) ended at ${SECONDS} s"
# The rest of tests/course (the checkers with a local learner, the build, the website's pages,
# the terminology ...): it looks only at its own processes and files, so it runs in phase 2.
# The checkers of chapters 10-12 run in the fourth run, after tests/cluster (mostly waiting):
# in the first they made it the last to end by about ten minutes.
late=(tests/course/checks/test_ch10*.py tests/course/checks/test_ch11.py
  tests/course/checks/test_ch12.py)
course=()
for f in tests/course/checks/test_*.py tests/course/test_*.py; do
  case " ${alone[*]} ${late[*]} tests/course/test_exercises.py " in *" $f "*) continue ;; esac
  course+=("$f")
done
# 2. Four pytest runs side by side on the machine's cores, of what looks only at its own
#    processes and files (a launch demo's processes by their marker, /dev/shm files that stay,
#    a checker's own temporary folders, a lab's own namespaces and Slurm jobs):
#    - every lesson in en, and the rest of tests/course (above);
#    - every lesson in zh, every solution notebook in en less the lesson cells it repeats
#      (build/solutions-en, above; the zh solutions are the same code cells,
#      tests/course/test_build.py), and tests/course/test_exercises.py (every graded cell of an
#      unsolved exercise fails);
#    - the unit tests of the package (tests/runtime with the launcher's nbval notebooks,
#      tests/parallel, tests/test_*.py);
#    - tests/cluster: hosts in network namespaces, Slurm, the elastic and preemption runs, each
#      lab live. Most of its time is waiting (rendezvous and process-group timeouts, a job's
#      requeue), which overlaps the other three; its tests are made to pass under load (issue 43:
#      ten rounds beside other work).
#    `set -m`: a job started with & in a script would ignore SIGINT, which a kernel's interrupt is.
mkdir -p build
set -m
{ rc=0; "${pytest[@]}" notebooks/zh build/solutions-en tests/course/test_exercises.py || rc=$?; echo "test.sh: ended at ${SECONDS} s"; exit "$rc"; } >build/test-zh.log 2>&1 &
second=$!
{ rc=0; "${pytest[@]}" tests --ignore=tests/cluster --ignore=tests/course --ignore=tests/test_leak_checks.py || rc=$?; echo "test.sh: ended at ${SECONDS} s"; exit "$rc"; } >build/test-unit.log 2>&1 &
third=$!
# After tests/cluster (what minds load most: rendezvous and process-group timeouts) and the late checkers, and
# beside the rest of phase 2: the other Pythons, where DDP_LAB_PYTHONS names them (CI's
# .ci/run does): a venv each with torch, and the tests that depend on the Python version
# (tests/pythons.sh; none looks at other runs' processes or files). Run after the site, as
# before, they made the run about 9 minutes longer.
rm -f build/test-cluster.rc build/test-pythons.rc
{
  rc=0
  "${pytest[@]}" tests/cluster "${late[@]}" >build/test-cluster.log 2>&1 || rc=$?
  echo "$rc" >build/test-cluster.rc
  echo "test.sh: ended at ${SECONDS} s" >>build/test-cluster.log
  if [ -n "${DDP_LAB_PYTHONS:-}" ]; then
    rc=0
    # the install started at the beginning (not a child of this subshell: no `wait`)
    while [ -n "$install" ] && kill -0 "$install" 2>/dev/null; do sleep 5; done
    cat build/pythons-install.log >build/test-pythons.log 2>/dev/null
    bash tests/pythons.sh $DDP_LAB_PYTHONS >>build/test-pythons.log 2>&1 || rc=$?
    echo "$rc" >build/test-pythons.rc
    echo "test.sh: ended at ${SECONDS} s" >>build/test-pythons.log
  fi
} &
fourth=$!
set +m
"${pytest[@]}" notebooks/en "${course[@]}" || status=$?
echo "test.sh: ended at ${SECONDS} s"
wait "$second" || status=$?
echo "--- notebooks/zh build/solutions-en tests/course/test_exercises.py (run beside the above) ---"
cat build/test-zh.log
wait "$third" || status=$?
echo "--- tests without tests/cluster and tests/course (run beside the above) ---"
cat build/test-unit.log
wait "$fourth" || true
echo "--- tests/cluster and the checkers of chapters 10-12 (run beside the above) ---"
cat build/test-cluster.log
rc=$(cat build/test-cluster.rc 2>/dev/null || echo 1)
[ "$rc" -eq 0 ] || status=$rc
if [ -n "${DDP_LAB_PYTHONS:-}" ]; then
  echo "--- other Pythons: tests/pythons.sh $DDP_LAB_PYTHONS (run after tests/cluster) ---"
  cat build/test-pythons.log
  rc=$(cat build/test-pythons.rc 2>/dev/null || echo 1)
  [ "$rc" -eq 0 ] || status=$rc
fi
[ "$status" -eq 0 ] || exit "$status"
# The course website from those outputs (no lesson runs a second time: --missing fail), then
# Chromium on it (tests/course/test_site.py). Only after a whole run: extra pytest arguments
# may have left lessons out of the cache.
.venv/bin/ddp-lab site --out build/site --missing fail
DDP_LAB_SITE=build/site .venv/bin/python -m pytest -p no:cacheprovider \
  tests/course/test_site.py::test_site_in_a_browser
echo "test.sh: the site and its test ended at ${SECONDS} s"
