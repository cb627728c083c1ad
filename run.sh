#!/usr/bin/env bash
# One entry point for a fresh clone:
#   ./run.sh demo   — emulators + demo stream + KPL producer + `dagster dev` on 127.0.0.1:3000 (Ctrl-C stops all)
#   ./run.sh test   — the whole test suite (add pytest args, e.g. ./run.sh test -m "not slow")
#   ./run.sh simulate --seeds N --steps M — the deterministic simulation of the consumer fleet
#   ./run.sh lint   — ruff and mypy, as CI runs them before the tests
# Both install what they need first (a .venv from requirements.lock; the npm emulators into the user cache,
# from kcl_pipeline/local/npm/package-lock.json); a second run reuses them.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

setup() {
  if [ ! -x .venv/bin/python ] || [ ! -f .venv/.installed ] || [ requirements.lock -nt .venv/.installed ] \
      || [ pyproject.toml -nt .venv/.installed ]; then
    echo "==> installing Python dependencies into .venv (first run takes a few minutes: pyspark builds locally)"
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -c requirements.lock -e ".[dev]"
    touch .venv/.installed
  fi
  # The emulators: a checkout's node_modules if present, else the user cache (npm ci on first use).
  .venv/bin/python -c "from kcl_pipeline.local.emulators import find_node_modules; find_node_modules()"
}

cmd=${1:-help}
shift || true
case "$cmd" in
  test)
    setup
    exec .venv/bin/python -m pytest "$@"
    ;;
  demo)
    setup
    exec .venv/bin/kcl-pipeline demo "$@"
    ;;
  lint)
    setup
    .venv/bin/ruff check .
    exec .venv/bin/mypy
    ;;
  simulate)
    setup
    exec .venv/bin/kcl-pipeline simulate "$@"
    ;;
  setup)
    setup
    ;;
  *)
    echo "usage: ./run.sh demo | test [pytest args] | lint | simulate [--seeds N --steps M …] | setup" >&2
    exit 2
    ;;
esac
