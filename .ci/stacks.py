"""The stacks of .ci/stacks.txt: read once, for .ci/run (names, versions) and for
docs/compatibility.md's "Tested with" table (``table()``; tests/test_compat.py holds the page to
it).

    python .ci/stacks.py names           # the stacks with a venv of their own
    python .ci/stacks.py table           # the markdown table
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

FILE = Path(__file__).with_name("stacks.txt")
#: every stack runs on this Python (install.sh, .ci/stack_venv.sh)
PYTHON = "3.11"
#: Pythons whose grammar every module is compiled with (tests/test_compat.py), never run: no
#: CPU torch wheel for them is installable here
SYNTAX_ONLY = ("3.12", "3.13")
#: the build of each torch release a stack pins (the wheels on these machines)
TORCH_BUILDS = {"2.13.0": "CPU", "2.14.1": "CUDA 13 build, run on CPU"}
SUITES = {
    "all": "default suite + slow proofs",
    "default": "default suite",
    "energon": "loader tests (`-m energon`)",
    "torchvision": "tests that need torchvision (`-m torchvision`)",
}


@dataclass(kw_only=True, slots=True, frozen=True)
class Stack:
    name: str
    #: what is installed first: pip requirements (``torch==2.13.0``, ``torchvision==0.29.1``)
    torch: tuple[str, ...]
    transformers: str
    energon: str
    suite: str
    why: str


def stacks(path: Path = FILE) -> list[Stack]:
    """The stacks, in file order (the first: the development venv)."""
    found = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, torch, transformers, energon, suite, why = line.split(maxsplit=5)
        if suite not in SUITES:
            raise ValueError(f"{path}: stack {name!r} has suite {suite!r}; one of {list(SUITES)}")
        pins = tuple(torch.split(","))
        if not pins[0].startswith("torch==") or not all("==" in p for p in pins):
            raise ValueError(f"{path}: stack {name!r} pins {torch!r}; torch==X[,package==Y...]")
        found.append(
            Stack(
                name=name,
                torch=pins,
                transformers=transformers,
                energon=energon,
                suite=suite,
                why=why,
            )
        )
    return found


def torch_cell(stack: Stack) -> str:
    """The table's torch column: the release and its build, and what is pinned beside it."""
    version = stack.torch[0].removeprefix("torch==")
    build = TORCH_BUILDS.get(version)
    cell = f"{version} ({build})" if build else version
    return " + ".join([cell, *(p.replace("==", " ") for p in stack.torch[1:])])


def table(path: Path = FILE) -> str:
    """docs/compatibility.md's "Tested with" table."""
    rows = [
        "| stack | Python | torch | transformers | megatron-energon | what CI runs | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in stacks(path):
        rows.append(
            f"| {s.name} | {PYTHON} | {torch_cell(s)} | {s.transformers} | {s.energon} "
            f"| {SUITES[s.suite]} | {s.why} |"
        )
    for version in SYNTAX_ONLY:
        rows.append(
            f"| python-{version} | {version} | - | - | - | every module compiled with its "
            f"grammar, not run | no CPU torch wheel installable here |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "table"
    if what == "names":
        print("\n".join(f"{s.name} {s.suite}" for s in stacks()[1:]))
    else:
        print(table())
