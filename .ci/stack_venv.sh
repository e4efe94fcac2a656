#!/usr/bin/env bash
# Builds (or reuses) the venv of one stack of .ci/stacks.txt and prints its path:
#   .ci/stack_venv.sh NAME  ->  .venv-stack-NAME
# A consumer's order: torch==2.13.0 (the CPU wheel) first, then the stack pinned, then the
# package with its extras. Before installing the package, pip's dry run (no stack pins, as a
# user in a NeMo-RL or Bridge container would run it) must plan no change to torch, transformers
# or megatron-energon; the install itself keeps the pins in a constraints file, and the venv's
# versions are checked afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=$1
read -r _ TRANSFORMERS ENERGON _ < <(grep -E "^$NAME " .ci/stacks.txt) \
    || { echo "no stack '$NAME' in .ci/stacks.txt" >&2; exit 2; }
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
VENV=.venv-stack-$NAME
PIP=("$VENV/bin/python" -m pip -q --disable-pip-version-check)
{
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "${PIP[@]}" install torch==2.13.0
    PINS=$VENV/constraints.txt
    printf 'torch==2.13.0\ntransformers==%s\nmegatron-energon==%s\n' "$TRANSFORMERS" "$ENERGON" >"$PINS"
    "${PIP[@]}" install -c "$PINS" "transformers==$TRANSFORMERS" "megatron-energon==$ENERGON"
    # the user's install, planned without our pins: it must leave the stack alone
    "${PIP[@]}" install --dry-run --report "$VENV/plan.json" -e '.[hf,test]'
    "$VENV/bin/python" - "$VENV/plan.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))["install"]
touched = sorted(
    f"{item['metadata']['name']}=={item['metadata']['version']}"
    for item in plan
    if item["metadata"]["name"].lower() in {"torch", "transformers", "megatron-energon"}
)
assert not touched, f"pip install -e '.[hf,test]' would replace the stack's {touched}"
PY
    "${PIP[@]}" install -c "$PINS" -e '.[tools,test]'
    # as install.sh: Megatron-Bridge's own functions are tests/test_megatron_bridge.py's reference
    "${PIP[@]}" install -c "$PINS" --no-deps megatron-bridge==0.3.1
    "$VENV/bin/python" - "$TRANSFORMERS" "$ENERGON" <<'PY'
import importlib.metadata as m, sys
want = {"torch": "2.13.0+cpu", "transformers": sys.argv[1], "megatron-energon": sys.argv[2]}
have = {name: m.version(name) for name in want}
assert have == want, f"pip changed the stack: {have} != {want}"
PY
} >&2
echo "$VENV"
