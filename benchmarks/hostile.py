"""Work a hostile sample costs before it is rejected: seconds and peak RSS over the baseline.

Each case runs in a fresh process through the loader's per-sample path (``load_conversation``
then ``encode``, as a worker runs them), once with the default limits and once with the
limits lifted (the baseline: what the sample cost before the limits existed; run at a tenth of
the size where the full size takes minutes). Peak RSS is the process's high-water mark reset
right before the sample is processed (``/proc/self/clear_refs``), minus the RSS at that moment.

    python benchmarks/hostile.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CAPACITY = 8192

CASES = {
    "100k-turn conversation": "turns(100_000)",
    "50 MB text": "text(50 << 20)",
    "10 MB text (under the 16 MiB document cap)": "text(10 << 20)",
    "12000x12000 PNG (140 kB)": "png(12000)",
    "JPEG header claiming 9000x9000": "jpeg(9000)",
}
#: the same samples, limits lifted, at a size the baseline finishes
BASELINE = {
    "100k-turn conversation": ("turns(10_000)", "10k turns"),
    "50 MB text": ("text(2 << 20)", "2 MB text"),
    "10 MB text (under the 16 MiB document cap)": ("text(2 << 20)", "2 MB text"),
    "12000x12000 PNG (140 kB)": ("png(6000)", "6000x6000 PNG"),
    "JPEG header claiming 9000x9000": ("jpeg(9000)", "same JPEG"),
}

CHILD = textwrap.dedent(
    """
    import io, json, re, struct, sys, time
    from PIL import Image
    from energon_packing.config import PackingConfig
    from energon_packing.encoding.builtin import encode
    from energon_packing.encoding.chat import Skip
    from energon_packing.encoding.tokenizer import ChatTokenizer
    from energon_packing.loader.samples import load_conversation

    def ask(text):
        return [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]

    def turns(n):
        return {"json": json.dumps({"messages": ask("Hi?") * (n // 2)}).encode()}

    def text(n):
        return {"json": json.dumps({"messages": ask("x" * n)}).encode()}

    def png(side):
        buffer = io.BytesIO()
        Image.new("L", (side, side), 7).save(buffer, format="PNG")
        doc = {"messages": ask("<image>?"), "images": ["a.png"]}
        return {"json": json.dumps(doc).encode(), "a.png": buffer.getvalue()}

    def jpeg(side):
        buffer = io.BytesIO()
        Image.new("RGB", (16, 16)).save(buffer, format="JPEG")
        data = bytearray(buffer.getvalue())
        sof = data.index(b"\\xff\\xc0")
        data[sof + 5 : sof + 9] = struct.pack(">HH", side, side)
        doc = {"messages": ask("<image>?"), "images": ["a.jpg"]}
        return {"json": json.dumps(doc).encode(), "a.jpg": bytes(data)}

    def rss(field):
        return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

    case, lifted = sys.argv[1], sys.argv[2] == "1"
    knobs = dict(max_input_seq_length=CAPACITY)
    if lifted:
        knobs.update(max_turns=10**9, max_text_chars=10**12, max_image_pixels=10**12)
    config = PackingConfig(**knobs)
    tokenizer = ChatTokenizer("bundled")
    sample = eval(case)
    open("/proc/self/clear_refs", "w").write("5")
    before = rss("VmRSS")
    start = time.perf_counter()
    try:
        fields = load_conversation(sample)
        if fields.get("problem"):
            outcome = fields["problem"].split(":")[0]
        else:
            encode(key="k", tokenizer=tokenizer, config=config, **fields)
            outcome = "encoded"
    except Skip as e:
        outcome = e.reason
    if lifted and outcome in ("encoded", "overlong"):
        from energon_packing.encoding.vision import patchify  # what packing it would cost next
        for name, data in sample.items():
            if name != "json":
                patchify(data, config.vision)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "mb": (rss("VmHWM") - before) / 1024, "outcome": outcome}))
    """
).replace("CAPACITY", str(CAPACITY))


#: decode memory: a 24 MP grey PNG ramp, 16-bit vs its 8-bit twin (``images.decode``)
DECODES = {
    "24 MP 16-bit grey PNG, scale": ("16", "scale"),
    "24 MP 16-bit grey PNG, clip": ("16", "clip"),
    "24 MP 8-bit twin": ("8", "scale"),
}

DECODE_CHILD = textwrap.dedent(
    """
    import io, json, re, sys, time
    import numpy as np
    from PIL import Image
    from energon_packing.media.images import decode

    def rss(field):
        return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

    bits, mode = sys.argv[1], sys.argv[2]
    width, height = 6000, 4000
    ramp = np.linspace(0, 1, width * height).reshape(height, width)
    values = (ramp * (65535 if bits == "16" else 255)).astype(np.uint16 if bits == "16" else np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(values).save(buffer, format="PNG")
    data = buffer.getvalue()
    del ramp, values
    open("/proc/self/clear_refs", "w").write("5")
    before = rss("VmRSS")
    start = time.perf_counter()
    decode(data, max_pixels=None, high_bit_depth=mode, alpha_on_white=True)  # grey: no alpha
    seconds = time.perf_counter() - start
    mb = (rss("VmHWM") - before) / 1024
    print(json.dumps({"seconds": seconds, "mb": mb, "per_pixel": mb * 2**20 / (width * height),
                      "kb": len(data) / 1e3}))
    """
)


def measure_decode(bits: str, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", DECODE_CHILD, bits, mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(case: str, lifted: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, case, "1" if lifted else "0"],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    print(f"C={CAPACITY}; default limits vs limits lifted (baseline), one process per case\n")
    print(
        f"{'sample':<44}{'outcome':<18}{'seconds':>9}{'peak MB':>9}   "
        f"{'baseline sample':<16}{'outcome':<12}{'seconds':>9}{'peak MB':>9}"
    )
    for name, case in CASES.items():
        ours = measure(case, lifted=False)
        base_case, base_name = BASELINE[name]
        base = measure(base_case, lifted=True)
        print(
            f"{name:<44}{ours['outcome']:<18}{ours['seconds']:>9.3f}{ours['mb']:>9.1f}   "
            f"{base_name:<16}{base['outcome']:<12}{base['seconds']:>9.2f}{base['mb']:>9.1f}"
        )
    print("\ntarget: every hostile sample rejected in < 1 s with < 100 MB extra peak RSS")
    print(
        f"\n{'decode (6000x4000, one process each)':<44}{'file kB':>9}{'seconds':>9}"
        f"{'peak MB':>9}{'B/px':>7}"
    )
    for name, (bits, mode) in DECODES.items():
        row = measure_decode(bits, mode)
        print(
            f"{name:<44}{row['kb']:>9.0f}{row['seconds']:>9.2f}{row['mb']:>9.0f}"
            f"{row['per_pixel']:>7.1f}"
        )
    print("target: a 16-bit image within 2x the 8-bit twin's peak per pixel")


if __name__ == "__main__":
    main()
