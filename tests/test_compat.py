"""The supported range: transformers' internals checked on the installed release, the stacks CI
runs (docs/compatibility.md's table is generated from .ci/stacks.txt), setup.cfg's ranges
holding every stack, and every module compiled with the grammar of Python 3.12 and 3.13."""

from __future__ import annotations

import configparser
import functools
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from energon_packing.encoding import hf_compat

COMPAT_PAGE = REPO / "docs" / "compatibility.md"


@functools.cache
def _ci_stacks():
    """.ci/stacks.py (no package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("ci_stacks", REPO / ".ci" / "stacks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_every_internal_checks_on_the_installed_transformers():
    pytest.importorskip("transformers")
    checked = hf_compat.check()
    assert len(checked) >= 6 and "merged_images_kwargs" in checked


def test_a_missing_internal_fails_in_one_line_naming_the_range():
    transformers = pytest.importorskip("transformers")

    class Changed:
        tokenizer = type("T", (), {"init_kwargs": {}})()

        def _merge_kwargs(self, *args, **kwargs):
            raise TypeError("_merge_kwargs() got an unexpected keyword argument")

    for processor in (object(), Changed()):
        with pytest.raises(hf_compat.TransformersCompatError) as info:
            hf_compat.merged_images_kwargs(processor)
        message = str(info.value)
        assert "\n" not in message
        assert f"transformers {transformers.__version__}:" in message
        assert f"supports transformers {hf_compat.SUPPORTED}" in message
    with pytest.raises(hf_compat.TransformersCompatError) as info:
        hf_compat.require_processor_media(object())
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"transformers {transformers.__version__}: object has no ")
    assert "needs a transformers release where object defines them (not before 5.10.0;" in message


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_the_images_kwargs_are_what_the_processors_own_call_passes(family):
    """On every release: the processor's own ``__call__``, its image processor recorded, passes
    it exactly the keyword arguments ``merged_images_kwargs`` finds (Gemma 3: its
    pan-and-scan defaults among them)."""
    pytest.importorskip("transformers")
    from PIL import Image

    from energon_packing.testing.families import build

    processor = build(family, model=False)[0]
    merged = hf_compat.merged_images_kwargs(processor)
    real, seen = processor.image_processor, []

    class Recorder:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, images=None, **kwargs):
            seen.append(kwargs)
            return real(images, **kwargs)

    processor.image_processor = Recorder()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "A"}]}]
    text = processor.apply_chat_template(messages, tokenize=False)
    processor(text=[text], images=[[Image.new("RGB", (64, 48))]], return_tensors="np")
    assert seen == [merged]
    assert merged["return_tensors"] == "np"
    if family == "gemma3":
        assert merged["do_pan_and_scan"] is False


def test_each_changed_rule_and_its_version_is_in_the_docs():
    page = COMPAT_PAGE.read_text()
    for name in dir(hf_compat):
        if name.endswith("_SINCE"):
            version = ".".join(map(str, getattr(hf_compat, name)))
            assert f"`{name}`" in page and version in page, f"{name} ({version}) undocumented"


def test_the_tested_with_table_is_generated_from_the_stack_list():
    stacks = _ci_stacks()
    assert stacks.table() in COMPAT_PAGE.read_text(), (
        "docs/compatibility.md's table differs from `python .ci/stacks.py table`"
    )
    assert len(stacks.stacks()) >= 4


def test_each_stack_pins_its_torch_first_and_the_torchvision_suite_has_torchvision(tmp_path):
    """The torch column: ``torch==X`` (a build the table names) first, then its companions; the
    stack that runs ``-m torchvision`` installs torchvision, and the marker is registered."""
    stacks = _ci_stacks()
    for stack in stacks.stacks():
        assert stack.torch[0].removeprefix("torch==") in stacks.TORCH_BUILDS, stack
    (runs,) = [s for s in stacks.stacks() if s.suite == "torchvision"]
    assert runs.torch == ("torch==2.14.1", "torchvision==0.29.1", "timm==1.0.31")
    assert "+ torchvision 0.29.1 + timm 1.0.31 |" in stacks.table()
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    assert "\ntorchvision: " in config["tool:pytest"]["markers"]
    bad = tmp_path / "stacks.txt"
    bad.write_text("odd torchvision==0.29.1 5.24.0 7.4.1 torchvision why\n")
    with pytest.raises(ValueError, match="stack 'odd' pins 'torchvision==0.29.1'; torch==X"):
        stacks.stacks(bad)


def test_every_stack_is_inside_setup_cfg_ranges():
    """What CI runs is what setup.cfg admits, and the floor stack is the range's floor."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    options = config["options"]
    extras = config["options.extras_require"]
    wanted = {}
    for text in (options["install_requires"], extras["hf"], extras["test"]):
        for line in text.strip().splitlines():
            requirement = Requirement(line.split("#")[0].strip())
            wanted.setdefault(requirement.name, []).append(requirement.specifier)
    stacks = _ci_stacks().stacks()
    for stack in stacks:
        for name, version in (
            ("transformers", stack.transformers),
            ("megatron-energon", stack.energon),
            ("torch", stack.torch[0].removeprefix("torch==")),
        ):
            assert all(Version(version) in spec for spec in wanted[name]), (stack.name, name)
    floors = {s.version for specs in wanted["transformers"] for s in specs if s.operator == ">="}
    lowest = min(Version(s.transformers) for s in stacks)
    assert {Version(f).release[:2] for f in floors} == {lowest.release[:2]}
    assert str(hf_compat.SUPPORTED) == f">={floors.pop()}"
    python_requires = options["python_requires"]
    for version in ("3.11", *_ci_stacks().SYNTAX_ONLY):
        assert f"Python :: {version}" in config["metadata"]["classifiers"]
        assert Version(version) in Requirement(f"python{python_requires}").specifier


def _interpreter(version: str) -> str | None:
    """An installed ``python3.X``: pyenv's own build first (its shim on PATH may name a
    version that is not selected), else one on PATH."""
    pyenv = sorted((Path.home() / ".pyenv" / "versions").glob(f"{version}.*/bin/python{version}"))
    if pyenv:
        return str(pyenv[-1])
    found = shutil.which(f"python{version}")
    return found if found and "shims" not in Path(found).parts else None


def _sources() -> list[str]:
    roots = [REPO / "energon_packing", REPO / "tests", REPO / "benchmarks", REPO / ".ci"]
    return sorted(str(p) for root in roots for p in root.rglob("*.py"))


@pytest.mark.parametrize("version", _ci_stacks().SYNTAX_ONLY)
def test_every_module_compiles_with_the_grammar_of(version):
    """Python 3.12 and 3.13 run nothing here (no CPU torch wheel for them is installable on
    these machines): every module is compiled by their interpreter, warnings as errors (an
    invalid escape is a SyntaxWarning since 3.12)."""
    python = _interpreter(version)
    if python is None:
        pytest.skip(f"no python{version} interpreter on PATH or under ~/.pyenv/versions")
    sources = _sources()
    assert len(sources) > 100  # the scan finds the code (a scan that finds nothing proves nothing)
    code = (
        "import sys\n"
        "for path in sys.argv[1:]:\n"
        "    compile(open(path, encoding='utf-8').read(), path, 'exec')\n"
        "print(sys.version_info[:2])\n"
    )
    out = subprocess.run(
        [python, "-W", "error", "-c", code, *sources], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(tuple(int(p) for p in version.split(".")))


def test_a_rule_a_later_release_took_back_holds_only_between_the_two():
    """Qwen3-VL keeps the template's vision pair around a video from 5.10.0 to 5.24.x: the rule
    is in force there, not before, not from 5.25.0 on, nor without transformers (the newest
    rules); the checkpoint key still names the release it came in with."""
    in_force = {
        release: hf_compat.rule_in_force("qwen3_video_keeps_markup", release)
        for release in [(5, 9, 9), (5, 10, 0), (5, 24, 9), (5, 25, 0), (6, 0, 0), None]
    }
    assert in_force == {
        (5, 9, 9): False,
        (5, 10, 0): True,
        (5, 24, 9): True,
        (5, 25, 0): False,
        (6, 0, 0): False,
        None: False,
    }
    assert hf_compat.rule_in_force("video_frames_apart", None)
    assert not hf_compat.rule_in_force("video_frames_apart", (5, 5, 4))
    assert "qwen3_video_keeps_markup (since 5.10.0)" in hf_compat.pack_rules()
