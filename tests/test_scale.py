"""Reading at a constant cost per conversation (issue 25 item 2): Energon's open tar files keep
no list of every header they read."""

from __future__ import annotations

import io
import tarfile

from helpers import SAMPLE_DATA, loader_batches

from energon_packing import PackingTaskEncoder


def test_an_open_shard_keeps_no_header_list(tmp_path):
    from megatron.energon.flavors.webdataset.itar import ITarFile

    PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=64)  # installs the fix
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(50):
            info = tarfile.TarInfo(f"k{i}.json")
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    with open(path, "rb") as f, ITarFile.open(fileobj=f, mode="r:") as itar:
        names = []
        while (info := itar.next()) is not None:
            names.append(info.name)
            itar.offset = info.offset_data + 512
        assert names == [f"k{i}.json" for i in range(50)]  # reading is unchanged
        assert itar.members == []  # tarfile alone would hold 50 TarInfos here


def test_the_loader_reads_the_same_with_the_fix():
    te = PackingTaskEncoder(tokenizer="bundled", max_input_seq_length=8192)
    keys = [s.__key__ for s in loader_batches(SAMPLE_DATA, te, buffer=None, batch_size=None)]
    assert len(set(keys)) == len(keys) and all(k.startswith("sample") for k in keys)
    assert len(keys) + sum(te.stats.skipped.values()) == 400  # every sample, read once
