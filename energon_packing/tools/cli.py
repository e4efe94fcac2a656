"""``energon-packing``: the demo, dataset stats, pack previews, the training bench, prepare.

Built like Energon's own CLI (click). Every number printed comes from the library functions
the tests call, so what a person reads is what the code computes.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path

import click

from energon_packing import __version__
from energon_packing.loader.loading import epoch

__all__ = ["main"]

REPO_SAMPLE_DATA = Path(__file__).resolve().parents[2] / "sample_data"


def _quiet(*, progress: bool = False) -> None:
    """Keep the terminal for our report: Energon's pin_memory warning, its first-fill bar
    (unless we show a progress bar of our own) and per-sample skip logs (the report counts
    them) are noise here."""
    if not progress:
        os.environ.setdefault("TQDM_DISABLE", "1")
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    logging.getLogger("energon_packing").setLevel(logging.ERROR)


def _data_option(required: bool = False):
    return click.option(
        "--data",
        "data",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        default=None if required else (REPO_SAMPLE_DATA if REPO_SAMPLE_DATA.exists() else None),
        show_default="the bundled sample_data",
        help="A prepared Energon dataset.",
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="energon-packing")
def main() -> None:
    """Loader-side sequence packing for Megatron-Energon."""


def _processor_option(fn):
    return click.option(
        "--processor",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        default=None,
        help="A local directory holding a Hugging Face processor (its chat template, image "
        "tokens and pixels) instead of the built-in layout; never downloads.",
    )(fn)


@main.command()
@_data_option()
@click.option(
    "--capacity", default=2048, show_default=True, help="Pack width C (max_input_seq_length)."
)
@click.option(
    "--buffer", default=64, show_default=True, help="packing_buffer_size of the loader run."
)
@click.option(
    "--trainer-batch", default=16, show_default=True, help="Conversations per trainer batch."
)
@click.option(
    "--picture",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("energon-packing-demo.png"),
    show_default=True,
)
@click.option("--packs", "shown", default=6, show_default=True, help="Packs drawn in the picture.")
@_processor_option
def demo(
    data: Path | None,
    capacity: int,
    buffer: int,
    trainer_batch: int,
    picture: Path,
    shown: int,
    processor: Path | None,
) -> None:
    """Pack the bundled sample data through the real Energon loader and report."""
    _quiet()
    if data is None:
        raise click.UsageError("no bundled sample_data next to this install; pass --data PATH")
    from energon_packing.packing import lower_bound
    from energon_packing.tools.picture import draw, pack_segments
    from energon_packing.tools.report import (
        format_paths,
        format_skipped,
        format_table,
        loader_vs_trainer,
        measure_costs,
        packing_table,
        recommend,
    )

    # processor: the family's own template, image tokens and pixels
    knobs = dict(capacity=capacity, pad_multiple=8, max_pixels=None, overlong="drop")
    te = _encoder(tokenizer="bundled", processor=processor, carry=True, **knobs)
    start = time.perf_counter()
    batches = list(epoch(data, te, packing_buffer_size=buffer))
    seconds = time.perf_counter() - start
    stats = te.stats
    measured = measure_costs(
        data,
        _encoder(tokenizer="bundled", processor=processor, carry=True, **knobs),
        progress=False,
    )
    bound = lower_bound(measured.costs, capacity)
    sizes = [len(b["source_ids"][0]) for b in batches]
    click.echo(f"energon-packing demo: {data}" + (f" through {te.chat!r}" if processor else ""))
    click.echo(
        f"  {stats.read} conversations read, {stats.packed} packed into {stats.packs} packs of "
        f"{capacity} tokens in {seconds:.1f} s (real Energon loader, buffer {buffer}, carry on)"
    )
    click.echo(
        f"  conversations per pack: mean {sum(sizes) / len(sizes):.1f}, min {min(sizes)}, max {max(sizes)}"
    )
    click.echo(
        f"  efficiency {100 * stats.efficiency:.1f} % real tokens; lower bound {bound} packs, "
        f"so {100 * (stats.packs / bound - 1):+.2f} % over it"
    )
    click.echo(f"  {format_skipped(dict(stats.skipped), stats.skipped_keys)}\n")
    click.echo(
        "Every algorithm on the same conversations (pack_stream, the loader's own select code):"
    )
    rows = packing_table(measured, buffers=(buffer, 256))
    click.echo(format_table(rows))
    click.echo(recommend(rows) + "\n")
    click.echo("Loader path vs trainer path, same conversations:")
    click.echo(
        format_paths(
            loader_vs_trainer(
                measured, loader_packs=stats.packs, batch_size=trainer_batch, pad_multiple=8
            )
        )
        + "\n"
    )
    layouts = [pack_segments(b, 0, image_pad_id=te.image_token_id) for b in batches[:shown]]
    draw(
        layouts,
        picture,
        title=f"first {len(layouts)} loader packs of {data.name} (C={capacity}, carry)",
    )
    click.echo(f"picture of the first {len(layouts)} packs: {picture}")


def _encoder_options(fn):
    for option in reversed(
        [
            click.option("--capacity", default=8192, show_default=True, help="Pack width C."),
            click.option("--pad-multiple", default=8, show_default=True),
            click.option(
                "--max-pixels",
                default=None,
                type=int,
                help="Qwen2-VL max_pixels (default 1003520).",
            ),
            click.option(
                "--overlong",
                type=click.Choice(["drop", "truncate", "error"]),
                default="drop",
                show_default=True,
            ),
            click.option(
                "--tokenizer",
                default="bundled",
                show_default=True,
                help="Tokenizer path, or 'bundled' (the demo tokenizer of the sample data).",
            ),
            _processor_option,
        ]
    ):
        fn = option(fn)
    return fn


def _encoder(capacity, pad_multiple, max_pixels, overlong, tokenizer, processor, **extra):
    from energon_packing import PackingTaskEncoder

    knobs = dict(
        max_input_seq_length=capacity, pad_multiple=pad_multiple, overlong=overlong, **extra
    )
    if max_pixels is not None:
        knobs["max_pixels"] = max_pixels
    if processor is not None:
        return PackingTaskEncoder(processor=str(processor), **knobs)
    return PackingTaskEncoder(tokenizer=tokenizer, **knobs)


@main.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@_encoder_options
@click.option(
    "--buffer", "buffers", multiple=True, type=int, default=(64, 256, 1024), show_default=True
)
@click.option(
    "--algorithm", "algorithms", multiple=True, help="Only these algorithms (default: all)."
)
def stats(
    path: Path,
    capacity,
    pad_multiple,
    max_pixels,
    overlong,
    tokenizer,
    processor,
    buffers,
    algorithms,
) -> None:
    """Packing table of a prepared dataset, per algorithm and buffer, and a recommendation."""
    _quiet(progress=True)
    from energon_packing.packing import ALGORITHMS
    from energon_packing.tools.report import (
        format_skipped,
        format_table,
        measure_costs,
        packing_table,
        recommend,
    )

    te = _encoder(capacity, pad_multiple, max_pixels, overlong, tokenizer, processor)
    measured = measure_costs(path, te, progress=True)
    click.echo(
        f"{path}: {len(measured.costs)} conversations, {sum(measured.lengths):,} real tokens, "
        f"C={capacity}, pad_multiple={pad_multiple}"
    )
    click.echo(format_skipped(measured.skipped, te.stats.skipped_keys))
    rows = packing_table(measured, algorithms=algorithms or ALGORITHMS, buffers=buffers)
    click.echo(format_table(rows))
    click.echo(recommend(rows))


@main.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@_encoder_options
@click.option("--buffer", default=64, show_default=True)
@click.option("--carry/--no-carry", default=True, show_default=True)
@click.option("--packs", "count", default=4, show_default=True, help="Packs to show.")
@click.option(
    "--picture",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("energon-packing-preview.png"),
    show_default=True,
)
def preview(
    path: Path,
    capacity,
    pad_multiple,
    max_pixels,
    overlong,
    tokenizer,
    processor,
    buffer,
    carry,
    count,
    picture,
) -> None:
    """Print the first packs (segments, boundaries, image owners) and draw them."""
    import itertools

    _quiet()
    from energon_packing.tools.picture import describe, draw, pack_segments

    te = _encoder(capacity, pad_multiple, max_pixels, overlong, tokenizer, processor, carry=carry)
    batches = list(itertools.islice(epoch(path, te, packing_buffer_size=buffer), count))
    layouts = [pack_segments(b, 0, image_pad_id=te.image_token_id) for b in batches]
    click.echo(describe(layouts))
    draw(layouts, picture, title=f"{path.name}: first {len(layouts)} packs (C={capacity})")
    click.echo(f"picture: {picture}")


@main.command()
@_data_option()
@click.option("--steps", default=20, show_default=True)
@click.option("--capacity", default=2048, show_default=True)
@click.option("--buffer", default=64, show_default=True)
@click.option("--lr", default=3e-3, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--hidden", default=192, show_default=True, help="TinyVLM width (layers: 2, heads: 4)."
)
@click.option(
    "--picture",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("energon-packing-bench.png"),
    show_default=True,
)
def bench(
    data: Path | None,
    steps: int,
    capacity: int,
    buffer: int,
    lr: float,
    seed: int,
    hidden: int,
    picture: Path,
) -> None:
    """Train the tiny model on the same conversations through loader packs, trainer packs and
    padded batches; print tokens/s and losses, plot loss vs step and vs time."""
    _quiet()
    if data is None:
        raise click.UsageError("no bundled sample_data next to this install; pass --data PATH")
    import torch

    from energon_packing import PackingTaskEncoder
    from energon_packing.testing.model import TinyConfig
    from energon_packing.tools.bench import PATHS, plot, prepare, train

    torch.manual_seed(seed)
    te = PackingTaskEncoder(
        max_input_seq_length=capacity, tokenizer="bundled", pad_multiple=8, carry=True
    )
    inputs = prepare(data, te, steps=steps, buffer=buffer)
    config = TinyConfig(vocab_size=te.tokenizer.vocab_size, hidden=hidden, mlp=4 * hidden)
    curves = [
        train(name, path_steps, config=config, seed=seed, lr=lr)
        for name, path_steps in zip(PATHS, inputs)
    ]
    reference = curves[0].losses
    click.echo(
        f"TinyVLM, {len(reference)} steps of the same conversations, C={capacity}, lr={lr}, seed={seed}\n"
    )
    click.echo(
        f"{'path':<17}{'real tokens':>12}{'computed':>11}{'efficiency':>12}{'tokens/s':>11}"
        f"{'final loss':>12}{'max |dloss| vs loader':>23}"
    )
    for curve in curves:
        gap = max(abs(a - b) for a, b in zip(curve.losses, reference))
        click.echo(
            f"{curve.name:<17}{curve.real_tokens:>12,}{curve.computed_tokens:>11,}"
            f"{100 * curve.real_tokens / curve.computed_tokens:>11.1f}%{curve.tokens_per_second:>11,.0f}"
            f"{curve.losses[-1]:>12.4f}{gap:>23.2e}"
        )
    plot(curves, picture)
    click.echo(f"\ncurves: {picture}")


@main.command("prepare")
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--split-parts",
    multiple=True,
    default=("train:.*\\.tar$",),
    show_default=True,
    help="split:regex over shard paths, repeatable (patterns may overlap).",
)
def prepare_command(path: Path, split_parts) -> None:
    """Run `energon prepare` on a folder of WebDataset shards and write our dataset yamls."""
    from energon_packing.loader.prepare import prepare_dataset

    for written in prepare_dataset(path, split_parts=split_parts):
        click.echo(f"wrote {written}")
