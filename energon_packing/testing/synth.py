"""Synthetic multimodal conversations that this project generates and owns.

Scenes of coloured shapes are drawn with Pillow, and the conversations about them are true to
the picture (counts, colours, positions), so the data reads like a small VQA / captioning /
chat mix: 0-3 images per conversation, 1-4 turns, both content styles (LLaVA ``<image>``
strings and Hugging Face parts), lengths from a few dozen to a few thousand tokens.

Conversations with videos: :mod:`.clips`.

Used by ``sample_data/`` (see :func:`write_shards`), the tests and the benchmarks; the bundled
tokenizer was trained on :func:`corpus`. Deterministic for a seed.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw

__all__ = [
    "Conversation",
    "conversation",
    "conversations",
    "corpus",
    "draw",
    "encode_image",
    "random_scene",
    "sized_conversations",
    "write_shards",
]

COLORS = {
    "red": (214, 48, 49),
    "green": (46, 160, 67),
    "blue": (41, 98, 255),
    "yellow": (241, 196, 15),
    "orange": (230, 126, 34),
    "purple": (142, 68, 173),
    "black": (20, 20, 20),
    "white": (245, 245, 245),
    "gray": (127, 140, 141),
    "pink": (232, 67, 147),
    "teal": (22, 160, 133),
    "brown": (121, 85, 72),
}
BACKGROUNDS = {
    "light gray": (220, 221, 225),
    "cream": (250, 243, 221),
    "pale blue": (214, 234, 248),
    "dark blue": (25, 42, 86),
    "mint": (213, 245, 227),
    "beige": (235, 222, 200),
}
SHAPES = ("circle", "square", "triangle", "diamond", "rectangle")
NUMBERS = (
    "no",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
)

# Short original notes on everyday topics, for the text-only turns.
TOPICS = {
    "bread baking": [
        "Bread dough needs time more than it needs effort.",
        "A slow rise in a cool kitchen gives the crumb a deeper flavour.",
        "Weigh the flour instead of measuring it by the cup; it makes the result repeatable.",
        "Hydration is the ratio of water to flour, and most sandwich loaves sit near sixty-five percent.",
        "Steam in the first minutes of baking keeps the crust soft long enough for the loaf to expand.",
        "Let the loaf cool on a rack before slicing, or the inside will turn gummy.",
        "A sourdough starter is just flour and water that has collected wild yeast and bacteria.",
        "If the dough tears when you stretch it, rest it for ten minutes and try again.",
    ],
    "houseplants": [
        "Most houseplants die from too much water rather than too little.",
        "Check the soil with a finger before watering; if the top few centimetres are dry, water deeply.",
        "A pot without a drainage hole traps water around the roots.",
        "Bright indirect light suits ferns, pothos and most palms.",
        "Succulents want a sunny window and a gritty soil that dries quickly.",
        "Yellow lower leaves often mean the plant is getting more water than it can use.",
        "Repot in spring, when roots start to circle the bottom of the pot.",
        "Dust on the leaves blocks light, so wipe large leaves with a damp cloth now and then.",
    ],
    "cycling": [
        "A well inflated tyre rolls faster and resists punctures better.",
        "Check the tyre pressure once a week; tubes lose air slowly even without a hole.",
        "Clean and oil the chain after riding in the rain.",
        "Saddle height is right when your knee is slightly bent at the bottom of the pedal stroke.",
        "On long rides, eat a little every half hour instead of waiting until you are hungry.",
        "Shift to an easier gear before the climb starts, not halfway up.",
        "Lights front and back make you visible well before drivers can see your shape.",
        "A multitool, a spare tube and a small pump fit in a saddle bag and solve most roadside problems.",
    ],
    "astronomy": [
        "The Moon shows the same face to Earth because its rotation is locked to its orbit.",
        "Planets do not twinkle as much as stars because they appear as tiny discs, not points.",
        "Light from the Sun takes a little over eight minutes to reach Earth.",
        "A pair of ordinary binoculars reveals the four largest moons of Jupiter.",
        "Meteor showers happen when Earth crosses the trail of dust left by a comet.",
        "Your eyes need about twenty minutes in the dark to adapt fully.",
        "The Milky Way is easiest to see on moonless nights far from city lights.",
        "Saturn's rings are made of countless pieces of ice and rock, most smaller than a house.",
    ],
    "python programming": [
        "A list comprehension builds a new list from an existing iterable in one readable line.",
        "Use a dictionary when you need to look things up by a key rather than by position.",
        "Virtual environments keep the packages of one project away from another.",
        "Write a small test before fixing a bug, so you can see the fix work.",
        "The standard library has a module for most everyday tasks, from dates to compression.",
        "Type hints do not change how the code runs, but they help editors and reviewers.",
        "Generators produce values one at a time, which keeps memory use low for long sequences.",
        "Read the traceback from the bottom up; the last line usually names the actual problem.",
    ],
    "running": [
        "Most of your weekly running should feel easy enough to hold a conversation.",
        "Increase the weekly distance gradually, by about a tenth at most.",
        "Good shoes matter more than expensive clothing.",
        "A short warm-up of easy jogging prepares the muscles for faster efforts.",
        "Rest days are when the body adapts to the training.",
        "Drink water regularly through the day rather than all at once before a run.",
        "Hill repeats build strength without the pounding of fast flat running.",
        "Keep a simple log of your runs to notice patterns in how you feel.",
    ],
    "coffee": [
        "Freshly ground beans lose their aroma within minutes, so grind just before brewing.",
        "Water just off the boil, around ninety-three degrees, extracts coffee well.",
        "A finer grind extracts faster and can taste bitter if brewed too long.",
        "A kitchen scale makes the ratio of coffee to water consistent from cup to cup.",
        "Light roasts keep more of the fruit and acidity of the bean.",
        "Store beans in an airtight container away from light and heat.",
        "Espresso uses pressure to push water through a tightly packed puck of coffee.",
        "Cold brew steeps coarse grounds in cold water for many hours and tastes smooth.",
    ],
    "photography": [
        "Good light matters more than an expensive camera.",
        "The hour after sunrise and before sunset gives soft, warm light.",
        "Place the subject off centre to make a picture feel more balanced.",
        "A faster shutter speed freezes motion, a slower one shows it as blur.",
        "A wide aperture blurs the background and draws attention to the subject.",
        "Hold the camera with both hands and tuck your elbows in to reduce shake.",
        "Look at the edges of the frame before pressing the shutter.",
        "Shooting many frames of the same scene makes it easier to pick a sharp one later.",
    ],
}
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a careful assistant that describes images accurately.",
    "Answer briefly and precisely.",
    "You are a friendly tutor. Explain your reasoning in plain words.",
)


@dataclass(kw_only=True, slots=True)
class Shape:
    kind: str
    color: str
    x: float  # centre, as a fraction of the width
    y: float
    size: float  # as a fraction of the shorter side


@dataclass(kw_only=True, slots=True)
class Scene:
    width: int
    height: int
    background: str
    shapes: list[Shape]


def random_scene(rng: random.Random) -> Scene:
    width = rng.choice((96, 128, 160, 224, 256, 320, 384, 448, 512, 640))
    height = rng.choice((96, 128, 160, 224, 256, 320, 384, 448))
    shapes = [
        Shape(
            kind=rng.choice(SHAPES),
            color=rng.choice(list(COLORS)),
            x=rng.uniform(0.15, 0.85),
            y=rng.uniform(0.15, 0.85),
            size=rng.uniform(0.08, 0.3),
        )
        for _ in range(rng.choice((1, 1, 2, 2, 3, 3, 4, 5, 6, 8, 12)))
    ]
    return Scene(
        width=width, height=height, background=rng.choice(list(BACKGROUNDS)), shapes=shapes
    )


def draw(scene: Scene) -> Image.Image:
    image = Image.new("RGB", (scene.width, scene.height), BACKGROUNDS[scene.background])
    canvas = ImageDraw.Draw(image)
    side = min(scene.width, scene.height)
    for shape in scene.shapes:
        cx, cy, r = shape.x * scene.width, shape.y * scene.height, shape.size * side / 2
        fill = COLORS[shape.color]
        if shape.kind == "circle":
            canvas.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill, outline=(0, 0, 0))
        elif shape.kind == "square":
            canvas.rectangle((cx - r, cy - r, cx + r, cy + r), fill=fill, outline=(0, 0, 0))
        elif shape.kind == "rectangle":
            canvas.rectangle((cx - 1.6 * r, cy - r * 0.8, cx + 1.6 * r, cy + r * 0.8), fill=fill)
        elif shape.kind == "triangle":
            canvas.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
        else:  # diamond
            canvas.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=fill)
    return image


def encode_image(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    if fmt == "jpg":
        image.save(buffer, format="JPEG", quality=80)
    else:
        image.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def _where(shape: Shape) -> str:
    vertical = "top" if shape.y < 0.4 else ("bottom" if shape.y > 0.6 else "middle")
    horizontal = "left" if shape.x < 0.4 else ("right" if shape.x > 0.6 else "centre")
    if vertical == "middle" and horizontal == "centre":
        return "in the centre"
    if vertical == "middle":
        return f"on the {horizontal}"
    return f"near the {vertical} {horizontal}" if horizontal != "centre" else f"at the {vertical}"


def _plural(word: str, count: int) -> str:
    return word if count == 1 else word + "s"


def describe(scene: Scene, rng: random.Random) -> str:
    n = len(scene.shapes)
    parts = [
        f"The picture is {scene.width} by {scene.height} pixels with a {scene.background} "
        f"background and {NUMBERS[n]} {_plural('shape', n)}."
    ]
    for shape in scene.shapes:
        size = "small" if shape.size < 0.14 else ("large" if shape.size > 0.24 else "medium")
        parts.append(
            rng.choice(
                (
                    f"There is a {size} {shape.color} {shape.kind} {_where(shape)}.",
                    f"A {shape.color} {shape.kind} of {size} size sits {_where(shape)}.",
                    f"{_where(shape).capitalize()} you can see a {size} {shape.color} {shape.kind}.",
                )
            )
        )
    colors = sorted({s.color for s in scene.shapes})
    if len(colors) > 1:
        parts.append(f"The colours used are {', '.join(colors[:-1])} and {colors[-1]}.")
    return " ".join(parts)


def question_answer(scene: Scene, rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(("count", "color", "where", "biggest", "yesno"))
    shapes = scene.shapes
    if kind == "count":
        target = rng.choice(SHAPES)
        count = sum(s.kind == target for s in shapes)
        return (
            f"How many {target}s are in the picture?",
            f"There {'is' if count == 1 else 'are'} {NUMBERS[count]} {_plural(target, count)}.",
        )
    if kind == "color":
        shape = rng.choice(shapes)
        return (f"What colour is the {shape.kind} {_where(shape)}?", f"It is {shape.color}.")
    if kind == "where":
        shape = rng.choice(shapes)
        return (
            f"Where is the {shape.color} {shape.kind}?",
            f"The {shape.color} {shape.kind} is {_where(shape)}.",
        )
    if kind == "biggest":
        big = max(shapes, key=lambda s: s.size)
        return (
            "Which shape is the largest?",
            f"The largest one is the {big.color} {big.kind} {_where(big)}.",
        )
    color = rng.choice(list(COLORS))
    present = any(s.color == color for s in shapes)
    return (
        f"Is there anything {color} in the image?",
        f"{'Yes' if present else 'No'}, {'there is' if present else 'there is nothing'} {color} in the image.",
    )


def essay(rng: random.Random, topic: str, sentences: int) -> str:
    bank = TOPICS[topic]
    picked = [rng.choice(bank) for _ in range(sentences)]
    return " ".join(picked)


@dataclass(kw_only=True, slots=True)
class Conversation:
    """One generated sample: its JSON document, its image, video and audio parts (name ->
    bytes)."""

    key: str
    document: dict
    images: dict[str, bytes]
    videos: dict[str, bytes] = field(default_factory=dict)
    audios: dict[str, bytes] = field(default_factory=dict)


def conversation(rng: random.Random, key: str, *, max_images: int = 3) -> Conversation:
    """A conversation with 0..max_images images (none for a quarter of them)."""
    n_images = min(max_images, rng.choice((0, 0, 1, 1, 1, 2, 2, 3)))
    hf_style = rng.random() < 0.5
    scenes = [random_scene(rng) for _ in range(n_images)]
    names = [f"img{i}.{rng.choice(('jpg', 'jpg', 'png'))}" for i in range(n_images)]
    images = {name: encode_image(draw(s), name.rsplit(".", 1)[1]) for name, s in zip(names, scenes)}

    messages: list[dict] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    if n_images:
        lead = rng.choice(
            ("Look at this picture.", "Here is an image.", "Please study the images below.", "")
        )
        first_q, first_a = (
            ("Describe the image in detail.", describe(scenes[0], rng))
            if rng.random() < 0.5
            else question_answer(scenes[0], rng)
        )
        if n_images > 1:
            counts = [len(s.shapes) for s in scenes]
            first_q = "Which image has the most shapes, and what is in it?"
            best = counts.index(max(counts))
            first_a = f"Image {best + 1} has the most shapes. " + describe(scenes[best], rng)
        messages.append(_user(lead, first_q, names, hf_style))
        messages.append({"role": "assistant", "content": first_a})
        for _ in range(rng.choice((0, 0, 1, 2, 3))):
            q, a = question_answer(rng.choice(scenes), rng)
            messages.append({"role": "user", "content": q})
            messages.append({"role": "assistant", "content": a})
    else:
        topic = rng.choice(list(TOPICS))
        for turn in range(rng.choice((1, 1, 2, 3, 4))):
            q = (
                rng.choice(
                    (
                        f"Can you give me some advice about {topic}?",
                        f"What should a beginner know about {topic}?",
                        f"Tell me more about {topic}.",
                        f"I keep making mistakes with {topic}. Any tips?",
                    )
                )
                if turn == 0
                else rng.choice(
                    ("Go on.", "Anything else?", "Can you expand on that?", "Thanks! What else?")
                )
            )
            sentences = int(rng.lognormvariate(1.6, 0.9)) + 1
            if rng.random() < 0.04:  # a long-form answer: a few conversations exceed 2k tokens
                sentences = rng.randint(80, 240)
            messages.append({"role": "user", "content": q})
            messages.append({"role": "assistant", "content": essay(rng, topic, sentences)})
    return Conversation(key=key, document={"messages": messages, "images": names}, images=images)


def _user(lead: str, question: str, names: list[str], hf_style: bool) -> dict:
    if hf_style:
        content: list[dict] = [{"type": "image", "image": name} for name in names]
        text = f"{lead} {question}".strip()
        content.append({"type": "text", "text": text})
        return {"role": "user", "content": content}
    placeholders = "\n".join("<image>" for _ in names)
    return {
        "role": "user",
        "content": f"{placeholders}\n{lead} {question}".replace("\n ", "\n").strip(),
    }


def conversations(n: int, *, seed: int, prefix: str = "conv") -> Iterator[Conversation]:
    rng = random.Random(seed)
    for index in range(n):
        yield conversation(rng, f"{prefix}{index:06d}")


# ---- videos: a shape moving over a plain background --------------------------------------


#: Where a shape starts and ends, as fractions of the frame (left/centre/right, top/middle/bottom).
def write_shards(
    directory: Path | str,
    items: list[Conversation] | Iterator[Conversation],
    *,
    per_shard: int = 1000,
    prefix: str = "shard",
    mtime: float | None = None,
) -> list[Path]:
    """Writes WebDataset tars: ``<key>.json`` plus ``<key>.<image name>``, ``<key>.<video
    name>`` and ``<key>.<audio name>`` parts.

    Args:
        directory: Where the shards go (created).
        items: The conversations, in order.
        per_shard: Conversations per shard.
        prefix: Shard file names are ``<prefix>-00000.tar``, ...
        mtime: The members' modification time (default: now); fixed, the same conversations
            give the same bytes.
    """
    import webdataset as wds

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    writer = None
    for index, item in enumerate(items):
        if index % per_shard == 0:
            if writer is not None:
                writer.close()
            paths.append(directory / f"{prefix}-{len(paths):05d}.tar")
            writer = wds.TarWriter(str(paths[-1]), mtime=mtime)
        sample = {"__key__": item.key, "json": json.dumps(item.document).encode()}
        sample.update(item.images)
        sample.update(item.videos)
        sample.update(item.audios)
        writer.write(sample)
    if writer is not None:
        writer.close()
    return paths


def corpus(n: int, *, seed: int) -> Iterator[str]:
    """Text for training the bundled tokenizer: every turn of ``n`` conversations."""
    for item in conversations(n, seed=seed, prefix="corpus"):
        for message in item.document["messages"]:
            content = message["content"]
            if isinstance(content, list):
                content = " ".join(part.get("text", "") for part in content)
            yield content


def _overhead(tokenizer) -> int:
    """Tokens of a sized conversation around its answer words (ChatML headers and ends)."""
    from energon_packing.config import PackingConfig
    from energon_packing.encoding.builtin import encode

    probe = encode(
        key="probe",
        messages=_sized_messages(1),
        image_names=[],
        images={},
        loss_weight=1.0,
        tokenizer=tokenizer,
        config=PackingConfig(max_input_seq_length=1 << 20),
    )
    return probe.length - 1


def _sized_messages(words: int) -> list[dict]:
    # " the" is one token of the bundled tokenizer; the pre-tokenizer never merges across words
    return [{"role": "user", "content": "Go."}, {"role": "assistant", "content": " the" * words}]


def sized_conversations(
    lengths, *, prefix: str = "sized", tokenizer=None
) -> Iterator[Conversation]:
    """Text-only conversations of exactly these token lengths (bundled tokenizer), for
    benchmarks that need a length mix through the real loader."""
    from energon_packing.encoding.tokenizer import ChatTokenizer

    overhead = _overhead(tokenizer or ChatTokenizer("bundled"))
    for index, length in enumerate(lengths):
        if length <= overhead:
            raise ValueError(f"length {length} is below the {overhead + 1}-token minimum")
        yield Conversation(
            key=f"{prefix}{index:07d}",
            document={"messages": _sized_messages(length - overhead)},
            images={},
        )
