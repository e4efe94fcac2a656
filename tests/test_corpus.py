"""Issue 17's done-when: exactly-once accounting over ONE corpus that mixes every real-world
fault (tar shards that lie, cut, repeat, link or dot their keys; images and documents as the web
makes them) with good conversations, through the real Energon loader on both paths.

Every document the tars hold (documents, not unique keys: an adjacent duplicate shares its key
with the later document, which is read) is in exactly one pack or one skip event, each fault
under its documented reason; the good conversations packed next to the faults are intact (their
slice of the pack equals their encoding alone, from an unpacked run of the same loader).
"""

from __future__ import annotations

import io
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from helpers import check_batch, loader_batches, raw_sample, stop_workers
from PIL import Image
from test_shards import conversations, document, lie_about_size, tar
from test_web_images import PROCESSOR_ASPECT, apng, grey_png, noise, one_image, oriented, save

from energon_packing.incoming.prepare import prepare_dataset
from energon_packing.incoming.shards import LOSSES_FILE, load_losses
from energon_packing.testing.synth import conversations as synth_conversations
from energon_packing.testing.synth import write_shards

pytestmark = pytest.mark.energon

CAPACITY = 2048
PACKED = None  # the expected outcome of a document that must land in a pack

#: the shard-level faults: shard name -> tar bytes (each key unique across the dataset, else
#: Energon's prepare refuses it; the one repeat is adjacent, inside dup.tar)
SHARDS = {
    "lie.tar": lambda: lie_about_size(tar(conversations(*(f"l{i}" for i in range(6)))), 2048, 700),
    "cat.tar": lambda: tar(conversations("c0")) + tar(conversations("c1")),
    "dup.tar": lambda: tar([("d0.json", document("d0 old")), ("d0.json", document("d0"))]),
    "links.tar": lambda: tar(
        [
            *conversations("n0"),
            ("n1.json", tarfile.SYMTYPE, "n0.json"),
            ("n2.json", tarfile.LNKTYPE, "n0.json"),
            ("n3.json", tarfile.DIRTYPE, ""),  # a directory: no document, nothing lost
        ]
    ),
    "dots.tar": lambda: tar(conversations("w0", "www.example.com_000", "www.example.com_001")),
    "parts.tar": lambda: tar([*conversations("p0"), (".json", document("h")), ("p1.png", b"x")]),
    "head.tar": lambda: tar(conversations("h0", "h1", "h2"))[: 2 * 1024 + 100],  # in h2's header
    "tail.tar": lambda: lie_about_size(tar(conversations(*(f"t{i}" for i in range(6)))), 0, 9000),
    # cut 40 bytes into u5's document: prepare --allow-losses cuts the shard back to u0..u4
    "cut.tar": lambda: tar(conversations(*(f"u{i}" for i in range(8))))[: 5 * 1024 + 512 + 40],
}

#: (key, outcome) per document the fault shards hold; "www" and "p1" are json-less samples
SHARD_OUTCOMES = [
    *[(f"l{i}", PACKED) for i in range(2)],
    ("l2", "malformed_json"),  # the liar's own document, read with the wrong bytes
    *[(f"l{i}", "lost_in_shard") for i in range(3, 6)],
    ("c0", PACKED),
    ("c1", "lost_in_shard"),  # after the first tar's end-of-archive blocks
    ("d0", "duplicate_key"),  # the earlier document
    ("d0", PACKED),  # the later one, read normally
    ("n0", PACKED),
    ("n1", "not_regular_file"),
    ("n2", "not_regular_file"),
    ("w0", PACKED),
    ("www.example.com_000", "dotted_key"),
    ("www.example.com_001", "dotted_key"),
    ("www", "missing_json"),  # what WebDataset makes of the dotted keys
    ("p0", PACKED),
    (".json", "unreachable_part"),
    ("p1", "missing_json"),
    ("h0", PACKED),
    ("h1", PACKED),
    ("h2", "truncated_member"),
    ("t0", "malformed_json"),
    *[(f"t{i}", "lost_in_shard") for i in range(1, 6)],
    *[(f"u{i}", PACKED) for i in range(5)],
    ("u5", "truncated_member"),
]

#: the keys the losses file must list, with their reason
LOST = {(k, r) for k, r in SHARD_OUTCOMES if r not in (PACKED, "malformed_json", "missing_json")}


def ask(content: str, answer: str = "Blue.") -> list[dict]:
    return [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]


def exif6() -> bytes:
    return oriented("JPEG", 6)  # 80x16 stored, 16x80 seen


def upright_twin() -> Image.Image:
    """The pixels of :func:`exif6` as a viewer shows them (orientation 6: turned 90 degrees
    clockwise), stored upright with no EXIF."""
    return noise(80, 16).transpose(Image.Transpose.ROTATE_270)


def web_samples() -> list[tuple[dict, str | None]]:
    """Sample-level classes, each between good conversations: (shard sample, outcome)."""
    bad_and_odd = [
        (one_image("line_a", "line.png", grey_png(1600, 7)), "image_aspect_ratio"),
        (one_image("line_b", "line.png", grey_png(1600, 7)), "image_aspect_ratio"),
        (one_image("tall_1x20000", "t.png", grey_png(1, 20000)), "image_aspect_ratio"),
        (one_image("exif6", "photo.jpg", exif6()), PACKED),
        (one_image("exif6_twin", "photo.jpg", save(upright_twin(), "JPEG")), PACKED),
        (one_image("name_space", "photo (1).jpg", save(noise(40, 30), "JPEG")), PACKED),
        (one_image("name_cjk", "图片.png", save(noise(40, 30), "PNG")), PACKED),
        (one_image("png_as_jpg", "x.jpg", save(noise(40, 30), "PNG")), PACKED),
        (one_image("avif", "a.avif", save(noise(40, 30), "AVIF")), PACKED),
        (one_image("qoi", "a.qoi", save(noise(40, 30), "QOI")), PACKED),
        (one_image("jp2", "a.jp2", save(noise(40, 30), "JPEG2000")), PACKED),
        (one_image("apng", "a.apng", apng()), PACKED),
        (one_image("png16", "a.png", png16()), PACKED),
        (one_image("subnormal", "a.png", grey_png(40, 30), loss_weight=1e-45), "bad_loss_weight"),
        (
            raw_sample(
                "assistant_image",
                {"messages": ask("Show me.", "<image>Here it is."), "images": ["a.png"]},
                {"a.png": save(noise(40, 30), "PNG")},
            ),
            PACKED,
        ),
        (raw_sample("overlong", {"messages": ask("word " * 4000)}), "overlong"),
        (raw_sample("bad_json", '{"messages": [nope'), "malformed_json"),
        ({"__key__": "nojson", "txt": b"a caption, no document"}, "missing_json"),
    ]
    samples = []
    for i, item in enumerate(bad_and_odd):  # a good conversation after every odd one
        samples += [item, (raw_sample(f"text{i:02d}", {"messages": ask(f"Hello {i}?")}), PACKED)]
    return samples


def png16() -> bytes:
    values = np.linspace(0, 20000, 64 * 48).reshape(48, 64).astype(np.uint16)
    return save(Image.fromarray(values), "PNG")


def build_corpus(path: Path) -> list[tuple[str, str | None]]:
    """Writes the shards and runs prepare with --allow-losses; returns (key, outcome) for every
    document the tars hold (and every json-less sample)."""
    import webdataset as wds

    shards = path / "shards"
    good = list(synth_conversations(10, seed=17, prefix="good"))  # 0-3 images each
    write_shards(shards, good, per_shard=5, prefix="a-good")
    web = web_samples()
    with wds.TarWriter(str(shards / "b-web.tar")) as writer:
        for sample, _ in web:
            writer.write(sample)
    for name, make in SHARDS.items():
        (shards / name).write_bytes(make())
    prepare_dataset(path, split_parts=["train:shards/.*"], allow_losses=True)
    outcomes = [(c.key, PACKED) for c in good]
    outcomes += [(s["__key__"], r) for s, r in web]
    return outcomes + SHARD_OUTCOMES


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus")
    return path, build_corpus(path)


def make_te(processor=None, **knobs):
    from energon_packing import PackingTaskEncoder

    return PackingTaskEncoder(
        tokenizer=None if processor else "bundled",
        processor=processor,
        max_input_seq_length=CAPACITY,
        **knobs,
    )


def run(path, *, workers, carry, processor=None):
    """One epoch; returns (packed keys in order, skip events, grids per key, batches, te)."""
    from energon_packing import MetricsAggregator
    from energon_packing.schema import is_empty

    te = make_te(processor, carry=carry)
    aggregate = MetricsAggregator()
    packed, grids, batches = [], {}, []
    try:
        for batch in loader_batches(path, te, buffer=8, workers=workers):
            aggregate.update(batch)
            if is_empty(batch):
                continue
            batches.append(batch)
            for row, keys in enumerate(batch["source_ids"]):
                packed += keys
                owners = batch["image_source_index"][row].tolist()
                if "image_grid_thw" not in batch:  # the processor path, a text-only batch
                    assert owners == [], keys
                    continue
                for owner, grid in zip(owners, batch["image_grid_thw"][row].tolist()):
                    grids.setdefault(keys[owner], []).append(grid)
    finally:
        stop_workers()
    return packed, list(aggregate.skipped), grids, batches, te


def alone(path, processor=None) -> dict:
    """Each conversation's encoding alone: the same loader, unpacked (no buffer, no batch)."""
    te = make_te(processor)
    encoded = {}
    for sample in loader_batches(path, te, buffer=None, batch_size=None):
        encoded[sample.__key__] = (np.asarray(sample.input_ids), np.asarray(sample.token_mask))
    return encoded


def accounting(outcomes, packed, skipped) -> tuple[Counter, Counter]:
    """(missing, extra): the outcomes no pack or skip event accounts for, and the reverse."""
    expected = Counter((k, "packed" if r is PACKED else r) for k, r in outcomes)
    got = Counter([(k, "packed") for k in packed] + [tuple(e) for e in skipped])
    return expected - got, got - expected


def normalized(skipped, outcomes, processor):
    """The processor path names an aspect ratio over 200 as its family does (see
    tests/test_web_images.py): one reason for all of them, then the documented one."""
    if processor is None:
        return skipped
    aspect = {k for k, r in outcomes if r == "image_aspect_ratio"}
    reasons = {r for k, r in skipped if k in aspect}
    assert len(reasons) == 1 and reasons <= PROCESSOR_ASPECT, reasons
    return [(k, "image_aspect_ratio" if k in aspect else r) for k, r in skipped]


def check(corpus, *, workers, carry, processor=None):
    path, outcomes = corpus
    packed, skipped, grids, batches, te = run(
        path, workers=workers, carry=carry, processor=processor
    )
    skipped = normalized(skipped, outcomes, processor)
    # exactly once, each fault under its own reason
    assert accounting(outcomes, packed, skipped) == (Counter(), Counter())
    assert {(k, r) for k, r in skipped if (k, r) in LOST} == LOST  # from the losses file
    assert len(skipped) == len(set(skipped)), "a skip event reported twice"
    # pack-mates intact: every packed slice equals that conversation's encoding alone
    encoded = alone(path, processor)
    pad = te.pad_id
    for batch in batches:
        if processor is None:
            check_batch(batch, te)  # the contract, image-pad and pixel-row counts included
        for row, keys in enumerate(batch["source_ids"]):
            ids, mask = batch["input_ids"][row].numpy(), batch["token_mask"][row].numpy()
            cu = batch["cu_seqlens_padded"][row].tolist()
            for k, key in enumerate(keys):
                own_ids, own_mask = encoded[key]
                start, end = cu[k], cu[k + 1]
                assert np.array_equal(ids[start : start + len(own_ids)], own_ids), key
                assert np.array_equal(mask[start : start + len(own_ids)], own_mask), key
                assert (ids[start + len(own_ids) : end] == pad).all(), key
                assert (mask[start + len(own_ids) : end] == 0).all(), key
    # the good neighbours of faults really shared packs with other conversations
    mates = [keys for b in batches for keys in b["source_ids"] if len(keys) > 1]
    for key in ("l1", "c0", "d0", "n0", "w0", "p0", "h1", "u4", "text00", "exif6"):
        assert any(key in keys for keys in mates), key
    # images as the user sees them: the sideways photo has its upright twin's grid (taller
    # than wide); with a processor, also the grid transformers' load_image + processor give
    assert grids["exif6"] == grids["exif6_twin"] and grids["exif6"][0][1] > grids["exif6"][0][2]
    if processor is not None:
        from transformers.image_utils import load_image

        upright = load_image(Image.open(io.BytesIO(exif6())))
        expected = processor.image_processor(images=[upright], return_tensors="np")
        assert grids["exif6"] == expected["image_grid_thw"].tolist()
    for key in ("name_space", "name_cjk", "png_as_jpg", "avif", "qoi", "jp2", "apng", "png16"):
        assert len(grids.get(key, [])) == 1, key
    # an image in an assistant turn is never trained
    image_id = te.image_token_id
    for batch in batches:
        for row, keys in enumerate(batch["source_ids"]):
            if "assistant_image" in keys:
                k = keys.index("assistant_image")
                cu = batch["cu_seqlens_padded"][row].tolist()
                ids = batch["input_ids"][row][cu[k] : cu[k + 1]]
                mask = batch["token_mask"][row][cu[k] : cu[k + 1]]
                assert (ids == image_id).sum() > 0
                assert (mask[ids == image_id] == 0).all()
                assert (mask > 0).any()


def test_the_losses_file_lists_what_the_tars_lose(corpus):
    """prepare --allow-losses wrote exactly the planted losses, each with its reason."""
    path, _ = corpus
    losses = [(k, r) for k, r, _ in load_losses(path)]
    assert sorted(losses) == sorted(LOST) and len(losses) == len(LOST)


def test_exactly_once_over_the_mixed_corpus(corpus):
    """The built-in path, workers 0, carry on (the default set)."""
    check(corpus, workers=0, carry=True)


def test_without_the_losses_file_the_lost_keys_vanish(corpus, tmp_path):
    """Today's loader without the losses file (Energon's prepare alone): the accounting above
    fails, and exactly the lost documents are missing (the check cannot pass by accident)."""
    path, outcomes = corpus
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    (copy / LOSSES_FILE).unlink()
    packed, skipped, *_ = run(copy, workers=0, carry=True)
    missing, extra = accounting(outcomes, packed, skipped)
    assert missing == Counter(LOST) and extra == Counter()


@pytest.mark.slow
@pytest.mark.parametrize("workers,carry", [(2, True), (0, False), (2, False)])
def test_exactly_once_with_workers_and_carry_off(corpus, workers, carry):
    check(corpus, workers=workers, carry=carry)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_exactly_once_on_the_processor_path(corpus, workers):
    """The same corpus through a tiny Qwen2-VL processor, carry on."""
    from energon_packing.testing.families import build

    processor, _, _ = build("qwen2_vl", model=False)
    check(corpus, workers=workers, carry=True, processor=processor)


def test_the_corpus_holds_every_class():
    """The corpus is what it claims: each planted key once per document, no key clash."""
    outcomes = [(s["__key__"], r) for s, r in web_samples()] + SHARD_OUTCOMES
    counts = Counter(k for k, _ in outcomes)
    assert {k for k, n in counts.items() if n > 1} == {"d0"}
    assert {r for _, r in outcomes} >= {
        "lost_in_shard", "duplicate_key", "not_regular_file", "dotted_key", "unreachable_part",
        "truncated_member", "missing_json", "malformed_json", "image_aspect_ratio",
        "bad_loss_weight", "overlong",
    }  # fmt: skip
