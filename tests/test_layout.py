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

#: adapters to other frameworks: they sit above the library, which never imports them
ADAPTERS = ("energon_packing.nemo_rl", "energon_packing.hf", "energon_packing.megatron_bridge")


def _other_adapters(room: str) -> tuple[str, ...]:
    return tuple(a for a in ADAPTERS if a != f"energon_packing.{room}")


#: room -> module prefixes it must never import (the room is the first folder under the package;
#: top-level modules schema/config/stats/errors form the room "core").
FORBIDDEN = {
    "packing": ("torch", "numpy", "megatron", "PIL", "transformers", "energon_packing."),
    "encoding": (
        "torch",
        "megatron",
        "energon_packing.loader",
        "energon_packing.incoming",
        "energon_packing.trainer",
    ),
    "media": ("megatron", "energon_packing."),  # but the core's errors: see ALLOWED_INSIDE
    "core": (
        "megatron",
        "energon_packing.loader",
        "energon_packing.incoming",
        "energon_packing.trainer",
        "energon_packing.encoding",
    ),
    # data coming in: records, tar headers, media checks, prepare; Energon's public CLI only
    # (see ALLOWED_INSIDE), never the loader it feeds
    "incoming": ("torch", "megatron", "energon_packing.loader", "energon_packing.trainer"),
    # the loader may read what incoming wrote (the losses file, the first sample's parts)
    "loader": ("energon_packing.trainer",),
    "trainer": (
        "megatron.energon",
        "energon_packing.loader",
        "energon_packing.incoming",
        "energon_packing.encoding",
    ),
    # NeMo-RL's task encoder is ours, subclassed: this adapter may use the loader
    "nemo_rl": ("energon_packing.incoming", *_other_adapters("nemo_rl")),
    # the trainer-side adapters take the contract's batches: core, schema, trainer only
    "hf": (
        "megatron.energon",
        "energon_packing.loader",
        "energon_packing.incoming",
        *_other_adapters("hf"),
    ),
    "megatron_bridge": (
        "megatron.energon",
        "energon_packing.loader",
        "energon_packing.incoming",
        *_other_adapters("megatron_bridge"),
    ),
    "tools": (),
    "testing": ("energon_packing.tools",),
}
#: nothing in the library imports the tooling, the test support, or an adapter
LIBRARY = (
    "packing",
    "encoding",
    "media",
    "core",
    "incoming",
    "loader",
    "trainer",
    "nemo_rl",
    "hf",
    "megatron_bridge",
)
BELOW_ADAPTERS = ("packing", "encoding", "media", "core", "incoming", "loader", "trainer")
EVERYWHERE = {
    room: ("energon_packing.tools", "energon_packing.testing")
    + (ADAPTERS if room in BELOW_ADAPTERS else ())
    for room in LIBRARY
}
#: the packing core may import itself
ALLOWED_INSIDE = {
    "packing": ("energon_packing.packing",),
    "media": ("energon_packing.media", "energon_packing.errors", "energon_packing.resize"),
    "incoming": ("megatron.energon.cli.main",),
}
#: Energon's public surface; everything deeper is an internal, used in one module only
ENERGON_PUBLIC = ("megatron.energon", "megatron.energon.errors", "megatron.energon.cli.main")
ENERGON_INTERNALS_MODULE = "energon_packing/loader/energon.py"
#: modules that exist for an optional consumer and import it (module -> what it needs)
OPTIONAL = {"energon_packing.nemo_rl.plugin": "nemo_rl"}


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def room_of(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else "core"


def module_of(path: Path, root: Path = PACKAGE) -> str:
    """``energon_packing.loader.energon`` for ``root/loader/energon.py`` (a package: its name)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join((root.name, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def imports_of(path: Path, root: Path = PACKAGE) -> list[str]:
    """Every module an ``import`` anywhere in the file names (function-level ones too), with
    relative imports resolved against the module's package (``from ..x import y`` in
    ``energon_packing.encoding.chat`` is ``energon_packing.x``)."""
    tree = ast.parse(path.read_text())
    package = module_of(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
        elif isinstance(node, ast.ImportFrom):  # relative
            base = ".".join(package[: len(package) - node.level + 1])
            if node.module:
                found.append(f"{base}.{node.module}")
            else:  # from . import x: the submodules x
                found += [f"{base}.{alias.name}" for alias in node.names]
    return found


def violations(path: Path, root: Path = PACKAGE) -> list[str]:
    """The imports of ``path`` its room forbids."""
    room = room_of(path, root)
    if path.name == "__init__.py" and room == "core":
        return []  # the package's lazy public names
    forbidden = FORBIDDEN[room] + EVERYWHERE.get(room, ())
    allowed = ALLOWED_INSIDE.get(room, ())
    return [
        name
        for name in imports_of(path, root)
        if any(_matches(name, f) for f in forbidden) and not any(_matches(name, a) for a in allowed)
    ]


def _matches(name: str, prefix: str) -> bool:
    return name == prefix.rstrip(".") or name.startswith(
        prefix if prefix.endswith(".") else prefix + "."
    )


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_room_imports_only_what_it_may(path):
    bad = violations(path)
    assert not bad, f"{path.relative_to(PACKAGE)} ({room_of(path)}) imports {bad}"


def test_every_room_has_rules():
    assert {room_of(p) for p in modules()} <= set(FORBIDDEN)


def test_incoming_data_is_one_room_the_loader_and_the_tools_use():
    """Convert, the record readers, the tar walk, the shard check and prepare live in
    ``incoming/``: only the loader (the losses file, the first sample's parts, the LLaVA turn
    reader) and the tools import it; the loader keeps only what touches
    Energon, and incoming touches Energon only through ``energon prepare``'s CLI."""
    importers = {
        room_of(path)
        for path in modules()
        if room_of(path) != "incoming"
        and any(_matches(n, "energon_packing.incoming") for n in imports_of(path))
    }
    assert importers == {"loader", "tools"}, importers
    for path in (PACKAGE / "loader").glob("*.py"):
        assert path.name == "__init__.py" or any(
            n.startswith("megatron.energon") for n in imports_of(path)
        ), f"loader/{path.name} does not touch Energon: it belongs in another room"
    energon = {
        str(path.relative_to(PACKAGE)): names
        for path in (PACKAGE / "incoming").glob("*.py")
        if (names := [n for n in imports_of(path) if n.startswith("megatron")])
    }
    assert energon == {"incoming/prepare.py": ["megatron.energon.cli.main"]}, energon
    moved = ("convert", "records", "media", "media_check", "tar_walk", "shards", "prepare")
    assert not [m for m in moved if (PACKAGE / "loader" / f"{m}.py").exists()]
    assert not [m for m in moved if (PACKAGE / "tools" / f"{m}.py").exists()]


def test_the_checker_flags_planted_incoming_imports(tmp_path):
    """A test of the test: incoming importing the loader, and the encoding importing
    incoming, are both flagged; incoming's use of Energon's CLI is not."""
    root = tmp_path / "energon_packing"
    (root / "incoming").mkdir(parents=True)
    (root / "encoding").mkdir()
    planted = root / "incoming" / "planted.py"
    planted.write_text(
        "from ..loader.samples import x\n"
        "from megatron.energon.cli.main import main\n"
        "import megatron.energon\n"
        "from . import records\n"
    )
    assert violations(planted, root) == ["energon_packing.loader.samples", "megatron.energon"]
    below = root / "encoding" / "planted.py"
    below.write_text("from ..incoming.records import to_document\n")
    assert violations(below, root) == ["energon_packing.incoming.records"]


def test_the_checker_flags_planted_relative_and_adapter_imports(tmp_path):
    """A test of the test: relative imports are resolved and judged by the same rules, and an
    adapter imported below tools/ is flagged."""
    root = tmp_path / "energon_packing"
    planted = root / "encoding" / "planted.py"
    planted.parent.mkdir(parents=True)
    (root / "encoding" / "__init__.py").write_text("from . import planted\n")
    planted.write_text(
        "from ..loader.task_encoder import PackingTaskEncoder\n"
        "from ..nemo_rl import to_nemo_rl\n"
        "from . import chat\n"
        "def later():\n"
        "    import energon_packing.hf.inputs\n"
    )
    assert imports_of(planted, root) == [
        "energon_packing.loader.task_encoder",
        "energon_packing.nemo_rl",
        "energon_packing.encoding.chat",
        "energon_packing.hf.inputs",
    ]
    assert violations(planted, root) == [
        "energon_packing.loader.task_encoder",
        "energon_packing.nemo_rl",
        "energon_packing.hf.inputs",
    ]
    assert imports_of(root / "encoding" / "__init__.py", root) == [
        "energon_packing.encoding.planted"
    ]
    core = root / "stats.py"
    core.write_text("from .loader import energon\nfrom .megatron_bridge.batch import x\n")
    assert violations(core, root) == [
        "energon_packing.loader",
        "energon_packing.megatron_bridge.batch",
    ]
    adapter = root / "hf" / "inputs.py"
    adapter.parent.mkdir()
    adapter.write_text("from ..loader.energon import x\nfrom ..schema import y\n")
    assert violations(adapter, root) == ["energon_packing.loader.energon"]


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


#: the one module that reads transformers' internals (docs/compatibility.md)
HF_COMPAT_MODULE = "energon_packing/encoding/hf_compat.py"
#: the one module that reads torch's internals, and what it reads (the storage made in shared
#: memory that torch's own default_collate uses; tests/test_handoff.py checks it is taken)
TORCH_INTERNALS = (
    "energon_packing/handoff.py",
    "getattr(torch.UntypedStorage, '_new_shared', None)",
)


def private_uses(path: Path) -> list[str]:
    """What a module reads past a library's public surface: transformers imports below the
    top-level package (``transformers.models...``, ``transformers.utils...``) or of ``_names``,
    and ``x._name`` attributes / ``getattr(x, "_name")`` on anything but ``self`` and ``cls``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("transformers.")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformers"):
            if node.module != "transformers":
                found.append(node.module)
            found += [f"transformers.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            owner = node.value
            if not node.attr.startswith("__") and not (
                isinstance(owner, ast.Name) and owner.id in ("self", "cls", "klass")
            ):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
            name = node.args[1] if len(node.args) > 1 else None
            owner = node.args[0] if node.args else None
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls", "klass"):
                continue
            text = str(name.value) if isinstance(name, ast.Constant) else ""
            if text.startswith("_") and not text.startswith("__"):
                found.append(ast.unparse(node))
    return found


def test_private_transformers_api_lives_in_one_module():
    """Only ``hf_compat`` reads transformers' internals; the library (tools and test support
    aside) calls its public API, and the Energon module reads Energon's internals alone."""
    uses = {}
    for path in modules():
        if room_of(path) not in LIBRARY:
            continue
        found = private_uses(path)
        if str(path.relative_to(PACKAGE.parent)) == ENERGON_INTERNALS_MODULE:
            found = [f for f in found if "transformers" in f]
        if str(path.relative_to(PACKAGE.parent)) == TORCH_INTERNALS[0]:
            found = [f for f in found if f != TORCH_INTERNALS[1]]
        if found:
            uses[str(path.relative_to(PACKAGE.parent))] = found
    assert list(uses) == [HF_COMPAT_MODULE], uses
    assert any("_merge_kwargs" in u for u in uses[HF_COMPAT_MODULE])


def test_the_private_api_checker_flags_planted_uses(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import transformers\n"
        "from transformers import AutoProcessor, _private\n"
        "from transformers.processing_utils import ProcessorMixin\n"
        "def f(processor, self):\n"
        "    self._ok, processor.__class__, processor.tokenizer\n"
        "    processor._merge_kwargs()\n"
        "    return getattr(processor, '_tokenizer'), getattr(processor, 'public')\n"
    )
    assert private_uses(planted) == [
        "transformers._private",
        "transformers.processing_utils",
        "processor._merge_kwargs",
        "getattr(processor, '_tokenizer')",
    ]


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


def test_the_encoding_and_media_rooms_load_without_torch():
    """Encoding a conversation needs no torch: the layouts, the registry and the video side
    import torch only when a pack's pixels are made (the media room's own lazy import), so the
    encoding room may use the media room directly (no video side injected from the loader)."""
    code = (
        "import sys, energon_packing.encoding, energon_packing.encoding.builtin, "
        "energon_packing.encoding.processor, energon_packing.encoding.families, "
        "energon_packing.media.video_side; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_video_rules_name_no_family():
    """One family registry (issue 33 item 4): a family's video processor is a declaration
    (:mod:`energon_packing.media.video_styles`) its registry entry names; the rules over it
    (rule, plan, side) never branch on a family's name, so a family whose video processor is
    laid out as one of these styles is one declaration, not a new code path."""
    from energon_packing.encoding.families import FAMILIES

    names = {f.name for f in FAMILIES} | {"builtin"}
    rules = [PACKAGE / "media" / f for f in ("video_rules.py", "video_plan.py", "video_side.py")]
    for path in rules:
        literals = {
            node.value
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        }
        assert not literals & names, f"{path.name} names families {sorted(literals & names)}"
    takes_videos = {f.name: f.videos for f in FAMILIES if f.videos is not None}
    assert sorted(takes_videos) == [
        "glm46v",
        "glm4v",
        "internvl",
        "qwen2_5_omni",
        "qwen2_5_vl",
        "qwen2_vl",
        "qwen3_omni",
        "qwen3_vl",
    ]
    assert all(style.name == name for name, style in takes_videos.items())


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
    ``stats.REASONS``, and docs/shards.md's table is ``stats.reason_table()``, generated."""
    from energon_packing.stats import REASONS

    emitted = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            position = {"Skip": 0, "_problem": 0, "_unexpected": 1}.get(name)
            if position is None or len(node.args) <= position:
                continue
            arg = node.args[position]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                emitted.setdefault(arg.value, str(path.relative_to(PACKAGE)))
    from energon_packing.incoming.records import REPORT_REASONS

    # convert's report (docs/cli.md) adds its own reasons for records never converted
    known = set(REASONS) | set(REPORT_REASONS)
    assert set(emitted) <= known, {r: p for r, p in emitted.items() if r not in known}
    cli = (PACKAGE.parent / "docs" / "cli.md").read_text()
    assert all(f"`{r}`" in cli for r in REPORT_REASONS), "docs/cli.md lacks a convert reason"
    assert len(emitted) >= 25  # the scan finds them (a scan that finds nothing proves nothing)
    from energon_packing.stats import reason_table

    page = (PACKAGE.parent / "docs" / "shards.md").read_text()
    assert reason_table() in page, "docs/shards.md's reason table differs from reason_table()"


def test_every_knob_is_in_the_readme_table():
    from energon_packing.config import KNOBS

    page = (PACKAGE.parent / "docs" / "configuration.md").read_text()
    missing = [k.name for k in KNOBS if f"| `{k.name}` |" not in page]
    assert not missing, f"docs/configuration.md's table lacks {missing}"


def public_surface() -> dict[str, list[str]]:
    """docs/contract.md's "Public surface" table: module -> the names it lists."""
    readme = (PACKAGE.parent / "docs" / "contract.md").read_text()
    section = readme.split("\n## Public surface\n", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`energon_packing"):
            table[cells[0].strip("`")] = [n.strip().strip("`") for n in cells[1].split(",")]
    return table


def test_the_public_surface_is_listed_once_and_exported_both_ways():
    """Every name the README lists is exported by its module, and every name a listed module
    exports (its ``__all__``; the package's lazy names) is listed."""
    import energon_packing

    table = public_surface()
    assert "energon_packing" in table and len(table) >= 8
    for name, listed in table.items():
        module = importlib.import_module(name)
        exported = list(energon_packing._LAZY) if name == "energon_packing" else module.__all__
        assert sorted(listed) == sorted(exported), (
            f"docs/contract.md's row for {name} != its exports"
        )
        missing = [n for n in listed if not hasattr(module, n)]
        assert not missing, f"{name} does not define {missing}"
    names = {n for listed in table.values() for n in listed}
    internals = {"CarryPackingDataset", "TolerantReader", "PackingGuard", "compare_settings"}
    assert not names & internals
    from energon_packing.loader import energon

    assert not set(energon.__all__) & internals


@pytest.mark.processor_media
def test_both_chat_layouts_are_the_one_declared_interface():
    """The task encoder talks to the built-in layout and to a processor's through
    ``ChatLayout`` alone: both are one, and it probes neither for optional methods."""
    from helpers import require_processor_media

    from energon_packing import PackingTaskEncoder
    from energon_packing.encoding.chat import ChatLayout
    from energon_packing.testing.families import build

    require_processor_media("gemma3")

    chats = [
        PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=64).chat,
        PackingTaskEncoder(processor=build("qwen2_vl")[0], max_input_seq_length=64).chat,
        PackingTaskEncoder(processor=build("gemma3")[0], max_input_seq_length=64).chat,
    ]
    assert all(isinstance(chat, ChatLayout) for chat in chats)
    assert [chat.videos is not None for chat in chats] == [True, True, False]
    encoder = (PACKAGE / "loader" / "task_encoder.py").read_text()
    assert "getattr(self.chat" not in encoder and "hasattr(self.chat" not in encoder
