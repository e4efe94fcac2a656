"""Corpora in the shapes users already have, written the way their tools write them.

* :func:`llava_json`: LLaVA-Instruct style, one JSON list + an image folder (``image`` paths
  relative to it), ``<image>\\n`` at the start of the first human turn, text-only records
  without ``image``;
* :func:`sharegpt_jsonl`: ShareGPT / LLaMA-Factory style JSONL, ``images`` lists and
  ``<image>`` placeholders anywhere, a system turn;
* :func:`messages_jsonl`: OpenAI-style ``messages`` with ``image_url`` parts (paths and
  ``data:`` URIs);
* :func:`cauldron_dataset`: the_cauldron style Hugging Face dataset (``images`` + ``texts``),
  through ``datasets`` itself: ``save_to_disk`` and ``to_parquet``.

Each returns the records' ground truth (what a converted document must say) so a test can
compare what comes out of the loader with what went in. Deterministic for a seed.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

from energon_packing.testing.synth import draw, encode_image, question_answer, random_scene

__all__ = ["cauldron_dataset", "llava_json", "messages_jsonl", "sharegpt_jsonl"]


def _image(rng: random.Random, fmt: str = "jpg") -> tuple[bytes, str]:
    scene = random_scene(rng)
    question, answer = question_answer(scene, rng)
    return encode_image(draw(scene), fmt), f"{question}|{answer}"


def _images(folder: Path, rng: random.Random, count: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(count):
        data, _ = _image(rng, "png" if i % 3 == 0 else "jpg")
        name = f"coco/train2017/{i:012d}.{'png' if i % 3 == 0 else 'jpg'}"
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
        names.append(name)
    return names


def llava_json(folder: Path, n: int, *, seed: int = 0, images: int = 8) -> Path:
    """``folder/llava.json`` + ``folder/images/...``; every third record text-only."""
    rng = random.Random(seed)
    files = _images(folder / "images", rng, images)
    records = []
    for i in range(n):
        record = {"id": f"{i:06d}-{rng.randrange(10**6)}"}
        turns = []
        for t in range(rng.randint(1, 3)):
            question = f"Question {t} about record {i}: what do you see?"
            if t == 0 and i % 3:
                question = "<image>\n" + question
            turns += [
                {"from": "human", "value": question},
                {"from": "gpt", "value": f"Answer {t}: " + "words " * rng.randint(5, 60)},
            ]
        if i % 3:
            record["image"] = rng.choice(files)
        record["conversations"] = turns
        records.append(record)
    path = folder / "llava.json"
    path.write_text(json.dumps(records, indent=1))
    return path


def sharegpt_jsonl(folder: Path, n: int, *, seed: int = 1, images: int = 8) -> Path:
    """``folder/sharegpt.jsonl`` with ``images`` lists (0-2 per record)."""
    rng = random.Random(seed)
    files = _images(folder / "media", rng, images)
    lines = []
    for i in range(n):
        count = i % 3
        listed = [f"media/{rng.choice(files)}" for _ in range(count)]
        human = "Compare " + " and ".join(["<image>"] * count) + f" for record {i}."
        record = {
            "conversations": [
                {"from": "system", "value": "You are a careful assistant."},
                {"from": "human", "value": human},
                {"from": "gpt", "value": "Sure. " + "text " * rng.randint(3, 40)},
            ],
            "images": listed,
        }
        lines.append(json.dumps(record))
    path = folder / "sharegpt.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def messages_jsonl(folder: Path, n: int, *, seed: int = 2, images: int = 6) -> Path:
    """``folder/messages.jsonl``: OpenAI-style parts, paths and ``data:`` URIs."""
    rng = random.Random(seed)
    files = _images(folder / "pics", rng, images)
    lines = []
    for i in range(n):
        content: list[dict] = [{"type": "text", "text": f"Describe picture {i}."}]
        if i % 2:
            if i % 4 == 1:
                url = f"pics/{rng.choice(files)}"
            else:
                data, _ = _image(rng)
                url = "data:image/jpeg;base64," + base64.b64encode(data).decode()
            content.insert(0, {"type": "image_url", "image_url": {"url": url}})
        record = {
            "id": i,
            "messages": [
                {"role": "user", "content": content},
                {"role": "assistant", "content": "It shows " + "things " * rng.randint(2, 30)},
            ],
        }
        lines.append(json.dumps(record))
    path = folder / "messages.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def cauldron_dataset(folder: Path, n: int, *, seed: int = 3) -> tuple[Path, Path]:
    """A the_cauldron-style dataset through ``datasets``: ``(save_to_disk folder, parquet)``."""
    import datasets

    rng = random.Random(seed)
    rows = {"images": [], "texts": []}
    for i in range(n):
        count = i % 3
        rows["images"].append([{"bytes": _image(rng)[0], "path": None} for _ in range(count)])
        rows["texts"].append(
            [
                {
                    "user": f"Question {t} of row {i}?",
                    "assistant": "Answer " + "x " * rng.randint(1, 20),
                    "source": "synthetic",
                }
                for t in range(rng.randint(1, 2))
            ]
        )
    features = datasets.Features(
        {
            "images": datasets.Sequence(datasets.Image()),
            "texts": [
                {
                    "user": datasets.Value("string"),
                    "assistant": datasets.Value("string"),
                    "source": datasets.Value("string"),
                }
            ],
        }
    )
    dataset = datasets.Dataset.from_dict(rows, features=features)
    disk = folder / "cauldron"
    dataset.save_to_disk(str(disk))
    parquet = folder / "cauldron.parquet"
    dataset.to_parquet(str(parquet))
    return disk, parquet
