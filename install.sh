#!/usr/bin/env bash
# Sets up .venv on a fresh machine: torch first (pinned CPU wheel), then the package and its
# test extras. Safe to re-run; a finished venv is reused.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# torch before anything that depends on it: with 2.13.0 in place, the package's `torch>=2.1`
# is already satisfied and pip never pulls a multi-GB CUDA build.
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[tools,test]'
# Megatron-Bridge's own functions are the reference for energon_packing.megatron_bridge
# (tests/test_megatron_bridge.py); --no-deps: its pins (transformers<5, Transformer Engine) are
# not needed for the few pure modules the tests load.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps megatron-bridge==0.3.1
