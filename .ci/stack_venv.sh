#!/usr/bin/env bash
# Builds (or reuses) the venv of one stack of .ci/stacks.txt and prints its path:
#   .ci/stack_venv.sh NAME  ->  .venv-stack-NAME
# A consumer's order: the stack's torch pins first (torch==2.13.0, the CPU wheel; or
# torch==2.14.1 with torchvision==0.29.1 and timm==1.0.31), then the stack pinned, then the package with its
# extras. Before installing the package, pip's dry run (no stack pins, as a user in a NeMo-RL or
# Bridge container would run it) must plan no change to torch, torchvision, transformers or
# megatron-energon; the install itself keeps the pins in a constraints file, and the venv's
# versions are checked afterwards (torch: the very build installed first).
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=$1
read -r _ TORCH TRANSFORMERS ENERGON _ < <(grep -E "^$NAME " .ci/stacks.txt) \
    || { echo "no stack '$NAME' in .ci/stacks.txt" >&2; exit 2; }
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
VENV=.venv-stack-$NAME
PIP=("$VENV/bin/python" -m pip -q --disable-pip-version-check)
{
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    IFS=, read -ra FIRST <<<"$TORCH"
    "${PIP[@]}" install "${FIRST[@]}"
    TORCH_BUILD=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('torch'))")
    PINS=$VENV/constraints.txt
    printf '%s\n' "${FIRST[@]}" "transformers==$TRANSFORMERS" "megatron-energon==$ENERGON" >"$PINS"
    "${PIP[@]}" install -c "$PINS" "transformers==$TRANSFORMERS" "megatron-energon==$ENERGON"
    # the user's install, planned without our pins: it must leave the stack alone
    "${PIP[@]}" install --dry-run --report "$VENV/plan.json" -e '.[hf,test]'
    "$VENV/bin/python" - "$VENV/plan.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))["install"]
touched = sorted(
    f"{item['metadata']['name']}=={item['metadata']['version']}"
    for item in plan
    if item["metadata"]["name"].lower()
    in {"torch", "torchvision", "transformers", "megatron-energon"}
)
assert not touched, f"pip install -e '.[hf,test]' would replace the stack's {touched}"
PY
    "${PIP[@]}" install -c "$PINS" -e '.[tools,test]'
    # as install.sh: Megatron-Bridge's own functions are tests/test_megatron_bridge.py's reference
    "${PIP[@]}" install -c "$PINS" --no-deps megatron-bridge==0.3.1
    "$VENV/bin/python" - "$TORCH_BUILD" "$TORCH" "$TRANSFORMERS" "$ENERGON" <<'PY'
import importlib.metadata as m, sys
build, first, transformers, energon = sys.argv[1:]
want = {"transformers": transformers, "megatron-energon": energon}
for pin in first.split(","):  # torch: the build installed first (2.13.0+cpu, 2.14.1+cu130)
    name, version = pin.split("==")
    want[name] = build if name == "torch" else version
have = {name: m.version(name).split("+")[0] if name != "torch" else m.version(name) for name in want}
assert have == want, f"pip changed the stack: {have} != {want}"
PY
} >&2
echo "$VENV"
