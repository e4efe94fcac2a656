"""Loader throughput and peak memory through a family's processor vs the built-in layout.

The bundled sample data (400 conversations, 0-3 images each) through the real Energon loader
(workers 0, carry on, C=2048), once per path, each in a fresh process: conversations per second
(best of 3 epochs) and the process's peak RSS over the epoch (``VmHWM``, reset after start-up).
Image sizes are made comparable: the built-in path resizes within 56*56..224*224 pixels, as the
Qwen processors here do. Two packing buffers show that waiting conversations hold compressed
images only (peak memory barely depends on the buffer).

    python benchmarks/processor_loader.py
"""

from __future__ import annotations

import json
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
        processor = build(path)[0]
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


def measure(path: str, buffer: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, path, str(buffer)],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    print("sample_data, C=2048, carry, workers 0; best of 3 epochs per path, fresh process each\n")
    head = f"{'path':<18}{'packs':>7}"
    for buffer in BUFFERS:
        head += f"{f'conv/s N={buffer}':>16}{'x builtin':>11}{f'peak MB N={buffer}':>18}"
    print(head)
    baseline = {}
    for path in PATHS:
        line = ""
        for buffer in BUFFERS:
            result = measure(path, buffer)
            baseline.setdefault(buffer, result["conv_per_s"])
            line += (
                f"{result['conv_per_s']:>16.0f}{result['conv_per_s'] / baseline[buffer]:>11.2f}"
                f"{result['peak_mb']:>18.1f}"
            )
        print(f"{path:<18}{result['packs']:>7}" + line)


if __name__ == "__main__":
    main()
