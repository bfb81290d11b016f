#!/usr/bin/env bash
# Install what the tests need into ./.venv (idempotent) and run the whole test suite.
#   bash test.sh [extra pytest arguments]
set -euo pipefail
cd "$(dirname "$0")"
DDP_LAB_EXTRAS=test bash setup.sh --no-lab
unset DDP_LAB_LANG  # each notebook picks its language from its folder
export MPLBACKEND=agg
.venv/bin/ruff check ddp_lab tests benchmarks
# Unit tests, the launcher's nbval notebook, every lesson and every solution notebook
# (both languages); exercises/ are checked by tests/test_exercises.py (graded cells must fail).
exec .venv/bin/python -m pytest -p no:cacheprovider --nbval-lax \
  --nbval-cell-timeout=300 tests notebooks solutions "$@"
