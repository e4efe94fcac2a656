"""Loader throughput through a family's processor: against its floor, and against the built-in.

1. The floor (default): what no packer can avoid is Energon reading the samples plus the
   processor once per conversation. One process per family measures, interleaved, 15 rounds
   (~4 min): (a) Energon's plain read of the bundled sample data (400 conversations, 0-3
   images each; a task encoder that does nothing, no packing), (b) the processor alone on the
   same conversations (its ``apply_chat_template`` and its own call on the decoded images, as
   ``load_image`` decodes them), (c) the packed loader (workers 0, carry on, C=2048, at each
   packing buffer of ``--buffers``, 64, 256 and 1024 by default), and prints the floor
   ``1 / (1/a + 1/b)`` in conversations/s, the ratio c / floor (target >= 0.95) of the best
   figures, the median of each round's own ratio and the
   built-in path's packed figure beside them. On a 2-core VM whose speed drifts by up to 30 %
   between rounds, 7 rounds move the best-of ratio by +-0.05; 15 by about +-0.02.
2. ``--table``: also loader throughput and peak RSS per path (fresh process each), at two
   packing buffers: waiting conversations hold compressed images only (peak memory barely
   depends on the buffer). Image sizes are comparable: the built-in path resizes within
   56*56..224*224 pixels, as the Qwen processors here do.

    python benchmarks/processor_loader.py [--families qwen2_vl,gemma3] [--rounds 15]
        [--buffers 64,256,1024] [--table]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap

PATHS = ("builtin", "qwen2_vl", "qwen3_vl", "gemma3", "idefics3", "llava_onevision")
BUFFERS = (64, 256)

CHILD = textwrap.dedent(
    """
    import json, re, sys, time, warnings
    warnings.filterwarnings("ignore")
    from energon_packing import PackingTaskEncoder
    from energon_packing.loader.loading import epoch
    from energon_packing.tools.cli import REPO_SAMPLE_DATA

    path, buffer = sys.argv[1], int(sys.argv[2])
    knobs = dict(max_input_seq_length=2048, pad_multiple=8, carry=True)
    if path == "builtin":
        def encoder():
            return PackingTaskEncoder(tokenizer="bundled", max_pixels=224 * 224, **knobs)
    else:
        from energon_packing.testing.families import build
        processor = build(path, model=False)[0]
        def encoder():
            return PackingTaskEncoder(processor=processor, **knobs)

    def rss(field):
        return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

    for _ in epoch(REPO_SAMPLE_DATA, encoder(), packing_buffer_size=buffer):  # warm up
        pass
    open("/proc/self/clear_refs", "w").write("5")
    base = rss("VmRSS")
    best = float("inf")
    for _ in range(3):
        te = encoder()
        start = time.perf_counter()
        for batch in epoch(REPO_SAMPLE_DATA, te, packing_buffer_size=buffer):
            pass
        best = min(best, time.perf_counter() - start)
    print(json.dumps({
        "conv_per_s": te.stats.packed / best,
        "packs": te.stats.packs,
        "peak_mb": (rss("VmHWM") - base) / 1024,
    }))
    """
)


FLOOR = textwrap.dedent(
    """
    import io, json, sys, time, warnings
    warnings.filterwarnings("ignore")
    from megatron.energon import TaskEncoder
    from PIL import Image
    from transformers.image_utils import load_image
    from energon_packing import PackingTaskEncoder
    from energon_packing.loader.loading import epoch
    from energon_packing.testing.families import build
    from energon_packing.tools.cli import REPO_SAMPLE_DATA

    family, rounds = sys.argv[1], int(sys.argv[2])
    buffers = [int(b) for b in sys.argv[3].split(",")]
    knobs = dict(max_input_seq_length=2048, pad_multiple=8, carry=True)
    processor = build(family, model=False)[0]
    bos = processor.tokenizer.bos_token

    class PlainRead(TaskEncoder):
        decoder = None  # images stay bytes, as in the packed loader

        def encode_sample(self, sample):
            return sample

        def batch(self, samples):
            return samples

    def hf_messages(messages, names):
        order, out, cursor = [], [], 0
        for message in messages:
            content, parts = message["content"], []
            if isinstance(content, str):
                for k, text in enumerate(content.split("<image>")):
                    if k:
                        while names[cursor] in order:
                            cursor += 1
                        order.append(names[cursor])
                        parts.append({"type": "image"})
                    if text:
                        parts.append({"type": "text", "text": text})
            else:
                for p in content:
                    if p["type"] == "image":
                        order.append(p["image"])
                        parts.append({"type": "image"})
                    else:
                        parts.append({"type": "text", "text": p["text"]})
            out.append({"role": message["role"], "content": parts})
        return out, order

    def plain():
        n = 0
        for batch in epoch(REPO_SAMPLE_DATA, PlainRead(), packing_buffer_size=None):
            n += len(batch)
        return n

    documents = [
        (s.messages, list(s.image_names), dict(s.images))
        for batch in epoch(REPO_SAMPLE_DATA, PlainRead(), packing_buffer_size=None)
        for s in batch
    ]

    def alone():
        ok = 0
        for messages, names, images in documents:
            try:
                chat, order = hf_messages(messages, names)
                text = processor.apply_chat_template(chat, tokenize=False)
                pil = [load_image(Image.open(io.BytesIO(images[n]))) for n in order]
                processor(
                    text=[text],
                    images=[pil] if pil else None,
                    add_special_tokens=not (bos and text.startswith(bos)),
                    return_tensors="np",
                )
                ok += 1
            except Exception:
                pass
        return ok

    def packed(buffer, **chosen):
        te = PackingTaskEncoder(**chosen, **knobs)
        for _ in epoch(REPO_SAMPLE_DATA, te, packing_buffer_size=buffer):
            pass
        return te.stats.packed

    runs = {"plain": plain, "alone": alone}
    for buffer in buffers:
        runs[f"packed {buffer}"] = lambda b=buffer: packed(b, processor=processor)
    runs["builtin"] = lambda: packed(64, tokenizer="bundled", max_pixels=224 * 224)
    for run in runs.values():  # warm up
        run()
    per_round = {name: [] for name in runs}
    for _ in range(rounds):  # interleaved: the machine's noise falls on every figure alike
        for name, run in runs.items():
            start = time.perf_counter()
            n = run()
            per_round[name].append(n / (time.perf_counter() - start))
    print(json.dumps(per_round))
    """
)


def child(script: str, *args: object, timeout: int) -> dict:
    """Runs ``script`` in a fresh interpreter; its last stdout line is JSON."""
    out = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bound(plain: float, alone: float) -> float:
    """The floor in conversations/s: Energon's read, then the processor, one after the other."""
    return 1.0 / (1.0 / plain + 1.0 / alone)


def print_floor(families: list[str], rounds: int, buffers: list[int]) -> None:
    print(
        f"sample_data, C=2048, carry, workers 0; packing buffers {buffers}; conversations/s, "
        f"best of {rounds}, interleaved in one process per family; 'per round': c / floor of "
        f"each round's own runs (median, min-max), which a slow spell of the machine moves "
        f"less; target: >= 0.95\n"
    )
    print(
        f"{'family':<18}{'(a) plain read':>15}{'(b) processor':>15}{'floor':>9}{'buffer':>8}"
        f"{'(c) packed':>12}{'c / floor':>11}{'per round':>18}{'builtin':>10}"
    )
    for family in families:
        r = child(FLOOR, family, rounds, ",".join(map(str, buffers)), timeout=3600)
        best = {name: max(values) for name, values in r.items()}
        limit = bound(best["plain"], best["alone"])
        for buffer in buffers:
            runs = r[f"packed {buffer}"]
            ratios = sorted(
                c / bound(a, b) for a, b, c in zip(r["plain"], r["alone"], runs, strict=True)
            )
            spread = f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
            print(
                f"{family:<18}{best['plain']:>15.0f}{best['alone']:>15.0f}{limit:>9.0f}"
                f"{buffer:>8}{max(runs):>12.0f}{max(runs) / limit:>11.2f}{spread:>18}"
                f"{best['builtin']:>10.0f}"
            )
    print()


def print_table() -> None:
    print("sample_data, C=2048, carry, workers 0; best of 3 epochs per path, fresh process each\n")
    head = f"{'path':<18}{'packs':>7}"
    for buffer in BUFFERS:
        head += f"{f'conv/s N={buffer}':>16}{'x builtin':>11}{f'peak MB N={buffer}':>18}"
    print(head)
    baseline = {}
    for path in PATHS:
        line = ""
        for buffer in BUFFERS:
            result = child(CHILD, path, buffer, timeout=1800)
            baseline.setdefault(buffer, result["conv_per_s"])
            line += (
                f"{result['conv_per_s']:>16.0f}{result['conv_per_s'] / baseline[buffer]:>11.2f}"
                f"{result['peak_mb']:>18.1f}"
            )
        print(f"{path:<18}{result['packs']:>7}" + line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="qwen2_vl", help="comma-separated families")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--buffers", default="64,256,1024", help="packing buffers of the packed loader"
    )
    parser.add_argument("--table", action="store_true", help="also the per-path table")
    args = parser.parse_args()
    print_floor(args.families.split(","), args.rounds, [int(b) for b in args.buffers.split(",")])
    if args.table:
        print_table()


if __name__ == "__main__":
    main()
