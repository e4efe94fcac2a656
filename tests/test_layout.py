"""The codebase's shape: rooms by tier and what each may import, public names, one schema."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "energon_packing"

#: room -> module prefixes it must never import (the room is the first folder under the package;
#: top-level modules schema/config/stats form the room "core").
FORBIDDEN = {
    "packing": ("torch", "numpy", "megatron", "PIL", "transformers", "energon_packing."),
    "encoding": ("torch", "megatron", "energon_packing.loader", "energon_packing.trainer"),
    "core": ("megatron", "energon_packing.loader", "energon_packing.trainer"),
    "loader": ("energon_packing.trainer", "energon_packing.nemo_rl"),
    "trainer": ("megatron.energon", "energon_packing.loader", "energon_packing.encoding"),
    "nemo_rl": (),
    "tools": (),
    "testing": ("energon_packing.tools",),
}
#: nothing in the library imports the tooling or the test support
LIBRARY = ("packing", "encoding", "core", "loader", "trainer", "nemo_rl")
EVERYWHERE = {room: ("energon_packing.tools", "energon_packing.testing") for room in LIBRARY}
#: the packing core may import itself
ALLOWED_INSIDE = {"packing": ("energon_packing.packing",)}
#: Energon's public surface; everything deeper is an internal, used in one module only
ENERGON_PUBLIC = ("megatron.energon", "megatron.energon.errors", "megatron.energon.cli.main")
ENERGON_INTERNALS_MODULE = "energon_packing/loader/energon.py"
#: modules that exist for an optional consumer and import it (module -> what it needs)
OPTIONAL = {"energon_packing.nemo_rl.plugin": "nemo_rl"}


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def room_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else "core"


def imports_of(path: Path) -> list[str]:
    """Every module an ``import`` anywhere in the file names (function-level ones too)."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return found


def _matches(name: str, prefix: str) -> bool:
    return name == prefix.rstrip(".") or name.startswith(
        prefix if prefix.endswith(".") else prefix + "."
    )


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_room_imports_only_what_it_may(path):
    room = room_of(path)
    if path.name == "__init__.py" and room == "core":
        return  # the package's lazy public names
    forbidden = FORBIDDEN[room] + EVERYWHERE.get(room, ())
    allowed = ALLOWED_INSIDE.get(room, ())
    bad = [
        name
        for name in imports_of(path)
        if any(_matches(name, f) for f in forbidden) and not any(_matches(name, a) for a in allowed)
    ]
    assert not bad, f"{path.relative_to(PACKAGE)} ({room}) imports {bad}"


def test_energon_internals_live_in_one_module():
    deep = {}
    for path in modules():
        names = [
            n
            for n in imports_of(path)
            if n.startswith("megatron.energon") and n not in ENERGON_PUBLIC
        ]
        if names:
            deep[str(path.relative_to(PACKAGE.parent))] = names
    assert list(deep) == [ENERGON_INTERNALS_MODULE], deep


@pytest.mark.parametrize(
    "path",
    [p for p in modules() if not p.name.startswith("_")],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_every_public_module_declares_its_names(path):
    name = ".".join(("energon_packing", *path.relative_to(PACKAGE).with_suffix("").parts))
    if name in OPTIONAL and importlib.util.find_spec(OPTIONAL[name]) is None:
        pytest.skip(f"{name} needs {OPTIONAL[name]}")
    module = importlib.import_module(name)
    assert isinstance(getattr(module, "__all__", None), list), f"{module.__name__} has no __all__"
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{module.__name__}.__all__ names {missing}, which it does not define"


def test_the_packing_core_loads_without_torch_numpy_or_energon():
    code = (
        "import sys, energon_packing.packing; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'megatron'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_trainer_shim_loads_without_energon():
    code = (
        "import sys, energon_packing.trainer; "
        "print(sorted(m for m in sys.modules if m.startswith('megatron.energon')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_one_layout_function_and_one_buffer_loop():
    """The pack layout and the buffer loop exist once: everything else calls them."""
    sources = {p: p.read_text() for p in modules()}
    layouts = [p for p, text in sources.items() if "\ndef layout(" in text]
    loops = [
        p for p, text in sources.items() if "def _fill(" in text or "_fill_reading_buffer" in text
    ]
    assert [p.name for p in layouts] == ["schema.py"]
    assert [p.name for p in loops] == ["stream.py"]


def test_every_skip_reason_is_registered_and_documented():
    """The skip report's vocabulary is closed: every reason the code can emit is in
    ``stats.REASONS``, and the README's table lists every one."""
    from energon_packing.stats import REASONS

    emitted = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            position = {"Skip": 0, "ImageError": 0, "_problem": 0, "_unexpected": 1}.get(name)
            if position is None or len(node.args) <= position:
                continue
            arg = node.args[position]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                emitted.setdefault(arg.value, str(path.relative_to(PACKAGE)))
    assert set(emitted) <= set(REASONS), {r: p for r, p in emitted.items() if r not in REASONS}
    assert len(emitted) >= 25  # the scan finds them (a scan that finds nothing proves nothing)
    readme = (PACKAGE.parent / "README.md").read_text()
    missing = [reason for reason in REASONS if f"| `{reason}` |" not in readme]
    assert not missing, f"README's reason table lacks {missing}"


def test_every_knob_is_in_the_readme_table():
    import dataclasses

    from energon_packing.config import PackingConfig

    readme = (PACKAGE.parent / "README.md").read_text()
    missing = [f.name for f in dataclasses.fields(PackingConfig) if f"| `{f.name}` |" not in readme]
    assert not missing, f"README's configuration table lacks {missing}"
