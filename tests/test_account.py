"""Every record exactly once on a user's own converted data, in one command (issue 31 item 7)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from energon_packing.incoming.convert import convert
from energon_packing.testing import corpora
from energon_packing.tools.cli import main


@pytest.mark.energon
def test_account_proves_every_record_exactly_once_and_names_a_missing_one(tmp_path):
    source = corpora.llava_json(tmp_path / "src", 16)
    out = tmp_path / "out"
    convert(source=source, out=out, media_root=tmp_path / "src" / "images", val_fraction=0.25)
    # capacity 256: the longer records are skipped (overlong), still accounted for
    result = CliRunner().invoke(main, ["account", str(out), "--capacity", "256", "--buffer", "8"])
    assert result.exit_code == 0, result.output
    line = result.output.strip().splitlines()[-1]
    assert "16 keys over train, val" in line and "every record exactly once" in line
    assert "overlong" in line and "of 16 converted records" in line

    with open(out / "convert_map.jsonl", "a") as f:  # a record the loader never sees
        f.write(json.dumps({"file": "x", "index": 99, "id": None, "key": "r999999999"}) + "\n")
    result = CliRunner().invoke(main, ["account", str(out), "--capacity", "256", "--buffer", "8"])
    assert result.exit_code == 1, result.output
    assert "1 never seen (first: r999999999)" in result.output
