"""The README's code, and every docs/ page's, runs as written.

Every ```python block of README.md and of docs/*.md runs on the bundled sample data from the
repository root,
each in a fresh namespace of this process (a name the block does not define is a ``NameError``;
torch, Energon and Megatron-Core are imported once for the whole suite), under a time limit, with
tracebacks that name README lines. Every ``energon-packing`` / ``energon`` command and flag the
README names exists in the CLI's own click table, and bash blocks call the venv's tools by path.
Blocks are extracted when the tests are collected: a block added later is tested as it lands.

Markers are HTML comments on the line(s) right before a block's fence:

* ``<!-- readme-test: needs-model FAMILY -->``: the block loads a model directory (a
  ``"/models/..."`` string). The test saves FAMILY's tiny processor and model
  (:mod:`energon_packing.testing.families`) to a temporary directory and puts its path in place
  of every ``/models/...`` path of the block. Skipped without ``transformers``.
* ``<!-- readme-test: needs-module MODULE -->``: skipped where MODULE does not import (an
  optional package: the Megatron-Bridge wheel, say).
* ``<!-- readme-test: needs-processor FAMILY -->``: the block runs FAMILY's processor path with
  images; skipped, naming what it lacks, on a transformers release without it
  (docs/compatibility.md).
* ``<!-- readme-test: slow -->``: the block runs under ``-m slow`` only.
* ``<!-- readme-test: run -->`` (bash blocks): the block runs under ``bash -e -o pipefail`` from
  the repository root with the word ``PATH`` standing for a folder that holds a copy of the
  sample shards (nothing prepared), ``OUT`` for a folder that does not exist yet, and the
  venv's ``bin`` off ``$PATH``. Slow: each line starts a CLI. Unmarked bash blocks are checked
  for commands and flags only.

``.venv/bin/python tests/test_readme.py`` runs every unmarked python block once, timed.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: every page whose blocks run: the README and the docs it links to
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
SAMPLE_DATA = ROOT / "sample_data"

MARKERS = ("needs-model", "needs-module", "needs-processor", "slow", "run")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*readme-test:\s*(?P<body>.*?)\s*-->\s*$")
MODEL_PATH = re.compile(r"/models/[^\"'\s]+")
TOOLS = ("energon-packing", "energon")
BLOCK_TIMEOUT_S = 120  # per python block; none takes 5 s on an idle 2-core machine
SLOW_TIMEOUT_S = 600


@dataclass(kw_only=True, slots=True)
class Block:
    """One fenced block of the README: ``line`` is its opening fence (1-based)."""

    lang: str
    line: int
    source: str  # dedented by the fence's indentation
    path: Path = README
    markers: dict[str, str] = field(default_factory=dict)  # marker -> its argument ("" if none)
    problems: list[str] = field(default_factory=list)

    @property
    def first_line(self) -> str:
        return next((s.strip() for s in self.source.splitlines() if s.strip()), "(empty)")

    @property
    def page(self) -> str:
        return (
            str(self.path.relative_to(ROOT)) if self.path.is_relative_to(ROOT) else str(self.path)
        )

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.lang} block `{self.first_line}`)"


def readme_blocks(text: str | None = None, path: Path = README) -> list[Block]:
    """Every fenced block of a page (the README by default), with the readme-test markers
    right above it."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent = opening["indent"]
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), len(lines))
        body = [line.removeprefix(indent) for line in lines[i + 1 : end]]
        block = Block(
            lang=opening["lang"] or "text", line=i + 1, source="\n".join(body) + "\n", path=path
        )
        if end == len(lines):
            block.problems.append("its fence is never closed")
        above = i - 1
        while above >= 0 and (marker := MARKER.match(lines[above])):
            name, _, argument = marker["body"].partition(" ")
            if name not in MARKERS:
                block.problems.append(f"unknown marker {name!r} (known: {', '.join(MARKERS)})")
            block.markers[name] = argument.strip()
            above -= 1
        blocks.append(block)
        i = end + 1
    return blocks


def all_blocks() -> list[Block]:
    """The blocks of every page."""
    return [block for page in PAGES for block in readme_blocks(path=page)]


def python_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.lang in ("python", "py")]


# --- running a block: a fresh namespace, README line numbers, a time limit ---------------------


def tiny_model_dir(family: str, directory: Path) -> Path:
    """FAMILY's tiny processor and random-init model, saved as a user's model directory is."""
    from energon_packing.testing.families import build

    processor, model, _ = build(family)
    directory.mkdir(parents=True, exist_ok=True)
    try:
        processor.save_pretrained(directory)
    except AttributeError:  # a processor built with video_processor=None cannot save itself
        for name in processor.get_attributes():
            part = getattr(processor, name, None)
            if part is not None:
                part.save_pretrained(directory)
        (directory / "chat_template.jinja").write_text(processor.chat_template)
    model.save_pretrained(directory)
    return directory


def _process_group() -> bool:
    distributed = sys.modules.get("torch.distributed")
    return distributed is not None and distributed.is_initialized()


def _timeout(signum, frame):
    raise TimeoutError("the block ran past its time limit")


def run_block(block: Block, *, source: str | None = None, timeout: float) -> str | None:
    """Executes the block in a fresh namespace (``__name__ == "__main__"``), from the current
    directory; returns the traceback, whose line numbers are README.md's, or None."""
    # blank lines up to the first code line, so tracebacks name README.md's own lines
    code = compile("\n" * block.line + (source or block.source), str(block.path), "exec")
    namespace = {"__name__": "__main__", "__file__": str(block.path)}
    had_group = _process_group()
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        exec(code, namespace)
        return None
    except (Exception, SystemExit):
        return traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        # a loader left half-read: end its workers now (its own teardown waits ~5 s per worker)
        for process in multiprocessing.active_children():
            process.terminate()
            process.join(timeout=5)
        namespace.clear()
        if _process_group() and not had_group:  # a block that failed before its own cleanup
            sys.modules["torch.distributed"].destroy_process_group()


def _tools_env() -> dict[str, str]:
    """The environment without the venv's ``bin`` on ``$PATH``: commands run as written."""
    venv_bin = Path(sys.prefix) / "bin"
    env = dict(os.environ, TQDM_DISABLE="1")
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != venv_bin
    )
    env.pop("VIRTUAL_ENV", None)
    return env


# --- the tests ------------------------------------------------------------------------------


def _param(block: Block):
    marks = [pytest.mark.slow] if "slow" in block.markers else []
    if "megatron.energon" in block.source:
        marks.append(pytest.mark.energon)
    return pytest.param(block, id=f"{block.path.stem}-line{block.line}", marks=marks)


def test_the_readme_blocks_are_found_and_marked_correctly():
    blocks = all_blocks()
    problems = [f"{b.where}: {p}" for b in blocks for p in b.problems]
    for b in blocks:
        if "needs-model" in b.markers:
            if b.markers["needs-model"] not in _families():
                problems.append(f"{b.where}: needs-model names no family of {_families()}")
            if not MODEL_PATH.search(b.source):
                problems.append(f"{b.where}: needs-model, but the block names no /models/ path")
        if b.markers.get("needs-processor", _families()[0]) not in _families():
            problems.append(f"{b.where}: needs-processor names no family of {_families()}")
        if "needs-module" in b.markers and not b.markers["needs-module"]:
            problems.append(f"{b.where}: needs-module names no module")
        if "run" in b.markers and b.lang not in ("bash", "sh"):
            problems.append(f"{b.where}: 'run' marks bash blocks (python blocks always run)")
    assert not problems, "\n".join(problems)
    # the sections this test exists for: a python block per section, at least
    assert len([b for b in blocks if b.lang == "python"]) >= 10
    assert {b.path.name for b in blocks if b.lang == "python"} >= {"README.md", "trainers.md"}


def test_the_readme_is_a_users_path_and_links_every_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", text))
    assert linked == {p.name for p in PAGES[1:]}, "a docs page the README does not link"
    for page in PAGES:  # relative links between pages point at files that exist
        for target in re.findall(r"\]\(([\w./-]+\.(?:md|png))(?:#[\w-]+)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: link to missing {target}"


def _families() -> tuple[str, ...]:
    from energon_packing.testing.families import FAMILIES

    return FAMILIES


@pytest.mark.parametrize("block", [_param(b) for b in python_blocks()])
def test_python_block_runs(block, tmp_path, monkeypatch):
    assert not block.problems, f"{block.where}: {block.problems}"
    source = block.source
    if module := block.markers.get("needs-module"):
        pytest.importorskip(module)
    if family := block.markers.get("needs-processor"):
        from helpers import processor_media_skip_reason

        pytest.importorskip("transformers")
        if reason := processor_media_skip_reason(family):
            pytest.skip(reason)
    if family := block.markers.get("needs-model"):
        pytest.importorskip("transformers")
        directory = tiny_model_dir(family, tmp_path / family)
        source = MODEL_PATH.sub(str(directory), source)  # loads as a user's would: no patches
    monkeypatch.chdir(ROOT)
    timeout = SLOW_TIMEOUT_S if "slow" in block.markers else BLOCK_TIMEOUT_S
    error = run_block(block, source=source, timeout=timeout)
    assert error is None, (
        f"{block.where} failed (it runs from the repository root, in a fresh namespace):\n{error}"
    )


def test_a_failing_block_names_its_readme_line():
    """Tracebacks name README lines: a NameError on the block's third line says line 6."""
    (block,) = readme_blocks("intro\n\n```python\nx = 1\n\ny = undefined_name\n```\n")
    error = run_block(block, timeout=5)
    assert block.line == 3 and block.first_line == "x = 1"
    assert 'README.md", line 6' in error
    assert "NameError: name 'undefined_name' is not defined" in error


def test_markers_are_the_comments_right_above_a_fence():
    text = (
        "<!-- readme-test: slow -->\n\n"  # a blank line: not this block's
        "<!-- readme-test: needs-model qwen2_vl -->\n<!-- readme-test: slow -->\n"
        "```python\nprint('/models/Qwen2-VL')\n```\n"
        "<!-- readme-test: skip -->\n  ```bash\n  ls\n  ```\n"
    )
    first, second = readme_blocks(text)
    assert first.markers == {"needs-model": "qwen2_vl", "slow": ""} and not first.problems
    assert (second.lang, second.line, second.source) == ("bash", 9, "ls\n")
    assert second.problems == [
        "unknown marker 'skip' (known: needs-model, needs-module, needs-processor, slow, run)"
    ]


def test_a_block_that_never_ends_fails():
    (block,) = readme_blocks("```python\nwhile True:\n    pass\n```\n")
    assert "TimeoutError: the block ran past its time limit" in run_block(block, timeout=0.2)


# --- commands named in the README ------------------------------------------------------------


def _command_texts() -> list[tuple[str, str]]:
    """(page:line, text) of every inline code span outside blocks and every line of a shell
    block, on every page."""
    texts = []
    for page in PAGES:
        blocks = readme_blocks(path=page)
        name = str(page.relative_to(ROOT))
        inside = {n for b in blocks for n in range(b.line, b.line + b.source.count("\n") + 2)}
        texts += [
            (f"{name}:{b.line + 1 + k}", line)
            for b in blocks
            if b.lang in ("bash", "sh", "shell", "console")
            for k, line in enumerate(b.source.splitlines())
        ]
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            if number not in inside:
                texts += [(f"{name}:{number}", span) for span in re.findall(r"`([^`]+)`", line)]
    return texts


def _invocations() -> list[tuple[str, str, str, list[str]]]:
    """(line, tool, subcommand, flags) of every ``energon-packing`` / ``energon`` call."""
    found = []
    for number, text in _command_texts():
        words = text.split("#")[0].split()
        for k, word in enumerate(words):
            tool = word.rsplit("/", 1)[-1]
            if tool not in TOOLS or k + 1 >= len(words):
                continue
            sub = words[k + 1]
            flags = []
            for arg in words[k + 2 :]:
                if arg in ("&&", "||", "|", ";"):
                    break
                if arg.startswith("--"):
                    flags.append(arg.split("=", 1)[0])
            found.append((number, tool, sub, flags))
    return found


def test_every_command_and_flag_the_readme_names_exists():
    from megatron.energon.cli.main import main as energon_main

    from energon_packing.tools.cli import main as packing_main

    groups = {"energon-packing": packing_main, "energon": energon_main}
    invocations = _invocations()
    problems = []
    for number, tool, sub, flags in invocations:
        if sub.startswith("-") or not re.fullmatch(r"[a-z][\w-]*", sub):
            continue  # `energon-packing --help`, or prose
        command = groups[tool].commands.get(sub)
        if command is None:
            problems.append(f"{number}: `{tool} {sub}`: no such command")
            continue
        known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
        problems += [
            f"{number}: `{tool} {sub} {flag}`: no such option (has {sorted(known)})"
            for flag in flags
            if flag not in known | {"--help"}
        ]
    assert not problems, "\n".join(problems)
    subs = {(tool, sub) for _, tool, sub, _ in invocations}
    for name in ("demo", "stats", "preview", "bench", "prepare", "convert", "check"):
        assert ("energon-packing", name) in subs


def test_shell_blocks_call_the_venvs_tools_by_path():
    """Bare ``energon`` works only in an activated venv; the README writes ``.venv/bin/``."""
    problems = []
    for block in all_blocks():
        if block.lang not in ("bash", "sh", "shell"):
            continue
        for k, line in enumerate(block.source.splitlines(), start=block.line + 1):
            words = shlex.split(line, comments=True)
            bare = [w for w in words if w in TOOLS]
            if bare:
                problems.append(f"{block.page}:{k}: `{bare[0]}` bare; write .venv/bin/{bare[0]}")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize(
    "block",
    [
        pytest.param(b, id=f"{b.path.stem}-line{b.line}")
        for b in all_blocks()
        if b.lang in ("bash", "sh") and "run" in b.markers
    ],
)
def test_marked_shell_block_runs(block, tmp_path):
    data = tmp_path / "data"
    (data / "shards").mkdir(parents=True)
    for shard in sorted((SAMPLE_DATA / "shards").glob("*.tar")):
        shutil.copy(shard, data / "shards")
    script = re.sub(r"(?<![$\w])PATH(?!\w)", str(data), block.source)
    script = re.sub(r"(?<![$\w])OUT(?!\w)", str(tmp_path / "out"), script)
    try:
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=ROOT,
            env=_tools_env(),
            capture_output=True,
            text=True,
            timeout=SLOW_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where} ran past {SLOW_TIMEOUT_S} s")
    assert done.returncode == 0, (
        f"{block.where} failed with exit status {done.returncode} (PATH = a copy of the sample "
        f"shards):\n{(done.stdout + done.stderr)[-4000:]}"
    )


if __name__ == "__main__":  # by hand: every python block once, with its time
    import resource

    def cpu() -> float:
        own, kids = (
            resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        )
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    os.chdir(ROOT)
    for block in python_blocks():
        start, used = time.perf_counter(), cpu()
        outcome = run_block(block, timeout=SLOW_TIMEOUT_S) if not block.markers else "marked"
        took = f"{time.perf_counter() - start:.1f} s, {cpu() - used:.1f} s CPU"
        print(f"{block.where}: {took}: {outcome or 'ok'}")
