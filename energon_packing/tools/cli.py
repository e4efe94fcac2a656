"""``energon-packing``: the demo, dataset stats, pack previews, the training bench, the shard
check and prepare.

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
from energon_packing.packing.algorithms import ALGORITHMS

# Energon and torch are imported inside the commands that use them: `--help`, argument errors
# and `convert` do not pay their ~2 s import

__all__ = ["main"]

REPO_SAMPLE_DATA = Path(__file__).resolve().parents[2] / "sample_data"
#: The bundled dataset with videos (``sample_data/regenerate.py`` writes it).
REPO_VIDEO_DATA = REPO_SAMPLE_DATA / "video"
#: The bundled dataset with audio clips (``sample_data/regenerate.py`` writes it).
REPO_AUDIO_DATA = REPO_SAMPLE_DATA / "audio"


def _quiet(*, progress: bool = False) -> None:
    """Keep the terminal for our report: Energon's pin_memory warning, its first-fill bar
    (unless we show a progress bar of our own) and per-sample skip logs (the report counts
    them) are noise here."""
    if not progress:
        os.environ.setdefault("TQDM_DISABLE", "1")
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    warnings.filterwarnings("ignore", message="skipping sample")  # the report counts them
    logging.getLogger("energon_packing").setLevel(logging.ERROR)


def _prepared(ctx: click.Context, param: click.Parameter, path: Path | None) -> Path | None:
    """A dataset folder Energon can open, or a one-line error saying how to make it one."""
    if path is None:
        return None
    meta = path / ".nv-meta"
    if not meta.is_dir():
        from energon_packing.incoming.shards import enclosing_dataset, shard_paths

        above = enclosing_dataset(path)
        if above is not None:
            raise click.BadParameter(
                f"{path} is a folder inside the prepared dataset {above}: pass {above}",
                ctx=ctx,
                param=param,
            )

        if shard_paths(path):
            raise click.BadParameter(
                f"{path} was never prepared (no .nv-meta/): run `energon-packing prepare {path}`",
                ctx=ctx,
                param=param,
            )
        raise click.BadParameter(
            f"{path} is no Energon dataset: no .nv-meta/ and no .tar shards under it",
            ctx=ctx,
            param=param,
        )
    for name, what in (("dataset.yaml", "our dataset.yaml"), ("index.sqlite", "the index")):
        if not (meta / name).is_file():
            raise click.BadParameter(
                f"{meta / name} is missing: run `energon-packing prepare {path}` (it writes "
                f"{what})",
                ctx=ctx,
                param=param,
            )
    from megatron.energon import WorkerConfig, get_train_dataset

    try:  # how every command opens it: a typo in dataset.yaml fails here, not mid-run
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            get_train_dataset(
                path,
                worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
                batch_size=None,
                shuffle_buffer_size=None,
                max_samples_per_sequence=None,
                repeat=False,
            )
    except Exception as e:  # Energon: bare AssertionError, TypeError, ModuleNotFoundError ...
        from energon_packing.errors import describe

        why = " ".join(describe(e).split())  # one line, whatever Energon's message holds
        raise click.BadParameter(
            f"{meta / 'dataset.yaml'} does not load ({why}); fix it, or "
            f"rewrite it with `energon-packing prepare {path}`",
            ctx=ctx,
            param=param,
        ) from None
    return path


#: The library's knob names in its messages, and the CLI flags that set them.
_FLAGS = {
    "max_input_seq_length": "--capacity",
    "pad_multiple": "--pad-multiple",
    "max_pixels": "--max-pixels",
    "overlong": "--overlong",
    "model_type": "--model-type",
}


def _flag_names(message: str) -> str:
    import re

    for knob, flag in _FLAGS.items():
        message = re.sub(
            rf"\b{knob}\b=?", lambda m, flag=flag: flag + (" " if "=" in m[0] else ""), message
        )
    return message


def _data_option(required: bool = False):
    return click.option(
        "--data",
        "data",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        callback=_prepared,
        default=None if required else (REPO_SAMPLE_DATA if REPO_SAMPLE_DATA.exists() else None),
        show_default="the bundled sample_data",
        help="A prepared Energon dataset.",
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="energon-packing")
def main() -> None:
    """Loader-side sequence packing for Megatron-Energon."""


def _remember(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    ctx.meta[param.name] = value  # read by _encoder: every command keeps its signature


def _processor_option(fn):
    fn = click.option(
        "--model-type",
        default=None,
        expose_value=False,
        callback=_remember,
        help="The model_type of the model's config.json, where the processor directory holds "
        "none (decides the family where a processor class serves several models).",
    )(fn)
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
@click.option(
    "--videos",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    callback=_prepared,
    default=None,
    help="A prepared dataset with videos, packed after the main report and drawn in a second "
    "picture (<picture>-video.png). Default: the bundled sample_data/video, unless --data is "
    "given.",
)
@click.option(
    "--audio",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    callback=_prepared,
    default=None,
    help="A prepared dataset with audio clips, packed after the videos through --processor "
    "(default: the tiny offline Qwen2.5-Omni processor, random weights, the family's own "
    "layout) and drawn in a third picture (<picture>-audio.png). Default: the bundled "
    "sample_data/audio, unless --data is given.",
)
@_processor_option
@click.pass_context
def demo(
    ctx: click.Context,
    data: Path | None,
    capacity: int,
    buffer: int,
    trainer_batch: int,
    picture: Path,
    shown: int,
    videos: Path | None,
    audio: Path | None,
    processor: Path | None,
) -> None:
    """Pack the bundled sample data through the real Energon loader and report; then the
    bundled conversations with videos (or --videos PATH) and with audio (or --audio PATH)."""
    _quiet()
    if data is None:
        raise click.UsageError("no bundled sample_data next to this install; pass --data PATH")
    if (
        videos is None
        and ctx.get_parameter_source("data") is click.core.ParameterSource.DEFAULT
        and (REPO_VIDEO_DATA / ".nv-meta").is_dir()
    ):
        videos = REPO_VIDEO_DATA
    if (
        audio is None
        and ctx.get_parameter_source("data") is click.core.ParameterSource.DEFAULT
        and (REPO_AUDIO_DATA / ".nv-meta").is_dir()
    ):
        audio = REPO_AUDIO_DATA
    from energon_packing.loader.loading import epoch
    from energon_packing.packing import lower_bound
    from energon_packing.schema import is_empty
    from energon_packing.tools.picture import draw, pack_segments
    from energon_packing.tools.report import (
        format_paths,
        format_skipped,
        format_table,
        loader_vs_trainer,
        measure_costs,
        packing_table,
        recommend,
        video_token_id,
    )

    # processor: the family's own template, image tokens and pixels
    knobs = dict(capacity=capacity, pad_multiple=8, max_pixels=None, overlong="drop")
    te = _encoder(tokenizer="bundled", processor=processor, carry=True, **knobs)
    start = time.perf_counter()
    batches = [b for b in epoch(data, te, packing_buffer_size=buffer) if not is_empty(b)]
    seconds = time.perf_counter() - start
    stats = te.stats
    if not batches:
        _nothing_to_pack(data, te, capacity, 8, None, "bundled", processor)
    measured = measure_costs(
        data,
        _encoder(tokenizer="bundled", processor=processor, carry=True, **knobs),
        progress=False,
    )
    bound = lower_bound(measured.costs, capacity, company=measured.company)
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
    layouts = [
        pack_segments(b, 0, image_pad_id=te.image_token_id, video_pad_id=video_token_id(te))
        for b in batches[:shown]
    ]
    draw(
        layouts,
        picture,
        title=f"first {len(layouts)} loader packs of {data.name} (C={capacity}, carry)",
    )
    click.echo(f"picture of the first {len(layouts)} packs: {picture}")
    knobs = dict(knobs, processor=processor)
    if videos is not None:
        _demo_videos(videos, knobs=knobs, buffer=buffer, picture=picture, shown=shown)
    if audio is not None:
        _demo_audio(audio, knobs=knobs, buffer=buffer, picture=picture, shown=shown)


def _demo_videos(path: Path, *, knobs: dict, buffer: int, picture: Path, shown: int) -> None:
    """The demo's video section: ``path`` packed through the real loader with the demo's
    knobs."""
    from energon_packing.tools.report import video_token_id

    te = _encoder(tokenizer="bundled", carry=True, **knobs)
    click.echo(f"\nVideos: {path}")
    if video_token_id(te) is None:
        click.echo(f"  not packed: {te.chat!r} takes no videos")
        return
    _demo_media("video", path, te, buffer=buffer, picture=picture, shown=shown)


def _demo_audio(path: Path, *, knobs: dict, buffer: int, picture: Path, shown: int) -> None:
    """The demo's audio section: ``path`` packed through the real loader, with ``--processor``
    where given, else the tiny offline Qwen2.5-Omni processor (random weights need none: its
    layout, tokens and features are the family's own)."""
    from energon_packing.tools.report import audio_token_id

    click.echo(f"\nAudio: {path}")
    processor = knobs["processor"]
    if processor is None:
        try:
            from energon_packing.testing.families import build

            processor = build("qwen2_5_omni", model=False)[0]
        except ImportError as e:
            click.echo(
                f"  not packed: audio needs a processor that takes it (Qwen2.5-Omni, "
                f"Qwen3-Omni), and {e.name or e} is not installed: pip install "
                "'transformers>=5.5' (or the checkout with [hf])"
            )
            return
    try:
        te = _encoder(tokenizer="bundled", carry=True, **dict(knobs, processor=processor))
    except click.UsageError as e:  # a transformers release the family needs more of
        click.echo(f"  not packed: {e.message}")
        return
    if audio_token_id(te) is None:
        click.echo(f"  not packed: {te.chat!r} takes no audio")
        return
    _demo_media("audio", path, te, buffer=buffer, picture=picture, shown=shown)


def _demo_media(kind: str, path: Path, te, *, buffer: int, picture: Path, shown: int) -> None:
    """One media section of the demo: what the packs hold, counted from the packs themselves,
    and a second picture (``<picture>-<kind>.png``) with the ``kind`` tokens marked."""
    from energon_packing.loader.loading import epoch
    from energon_packing.schema import is_empty
    from energon_packing.tools.picture import draw, pack_segments
    from energon_packing.tools.report import audio_token_id, format_skipped, video_token_id

    start = time.perf_counter()
    batches = [b for b in epoch(path, te, packing_buffer_size=buffer) if not is_empty(b)]
    seconds = time.perf_counter() - start
    stats = te.stats
    pads = dict(
        image_pad_id=te.image_token_id,
        video_pad_id=video_token_id(te),
        audio_pad_id=audio_token_id(te),
    )
    layouts = [
        pack_segments(b, row, **pads) for b in batches for row in range(len(b["source_ids"]))
    ]
    segments = [s for layout in layouts for s in layout.segments]
    if kind == "video":
        clips = sum(len(s.video_grids) for s in segments)
        held = sum(bool(s.video_grids) for s in segments)
        tokens = sum(p.video_tokens for p in layouts)
    else:
        clips = sum(len(s.audios) for s in segments)
        held = sum(bool(s.audios) for s in segments)
        tokens = sum(p.audio_tokens for p in layouts)
    label = "videos" if kind == "video" else kind
    through = f" through {te.chat!r}" if kind == "audio" else ""
    click.echo(
        f"  {stats.read} conversations read, {stats.packed} packed into {stats.packs} packs of "
        f"{te.config.max_input_seq_length} tokens in {seconds:.1f} s (same loader, buffer "
        f"{buffer}, carry on){through}"
    )
    click.echo(
        f"  in the packs: {held} conversations with {label}, {clips} {kind} clips, "
        f"{tokens:,} {kind} tokens, {sum(p.image_tokens for p in layouts):,} image tokens, "
        f"{sum(p.real_tokens for p in layouts):,} real tokens"
    )
    click.echo(f"  efficiency {100 * stats.efficiency:.1f} % real tokens")
    click.echo(f"  {format_skipped(dict(stats.skipped), stats.skipped_keys)}")
    if not layouts:
        return
    shown_layouts = layouts[:shown]
    second = picture.with_name(f"{picture.stem}-{kind}{picture.suffix}")
    marks = "video tokens xxxx" if kind == "video" else "audio tokens ...."
    draw(
        shown_layouts,
        second,
        title=f"first {len(shown_layouts)} loader packs of {path.name} (C="
        f"{te.config.max_input_seq_length}, carry): {marks}, image tokens ////",
    )
    click.echo(f"picture of the first {len(shown_layouts)} packs with {label}: {second}")


def _nothing_to_pack(path, te, capacity, pad_multiple, max_pixels, tokenizer, processor):
    """Every conversation was skipped: say so, with the reasons, instead of an empty table."""
    from energon_packing.tools.report import format_nothing_packed, shortest_cost

    shortest = None
    # limits that follow --capacity: how long is the shortest, measured without a limit?
    if {"overlong", "text_too_long", "too_many_turns"} & set(te.stats.skipped):
        shortest = shortest_cost(
            path,
            lambda width: _encoder(width, pad_multiple, max_pixels, "drop", tokenizer, processor),
            pad_multiple=pad_multiple,
        )
    raise click.ClickException(
        format_nothing_packed(
            path, te.stats.skipped, te.stats.skipped_keys, capacity=capacity, shortest=shortest
        )
    )


_SKIPS_HELP = "Write every key that would be skipped, with its reason, to FILE (JSON lines)."


def _encoder_options(fn):
    for option in reversed(
        [
            click.option("--capacity", default=8192, show_default=True, help="Pack width C."),
            click.option("--pad-multiple", default=8, show_default=True),
            click.option(
                "--max-pixels",
                default=None,
                type=int,
                help="Built-in layout: Qwen2-VL max_pixels, the resize target (default 1003520); "
                "with --processor set it in the processor's preprocessor_config.json.",
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
    knobs.setdefault("max_skips_without_pack", None)  # finite passes: we report, never stop
    context = click.get_current_context(silent=True)
    if context is not None and context.meta.get("model_type"):
        knobs["model_type"] = context.meta["model_type"]
    if max_pixels is not None:
        knobs["max_pixels"] = max_pixels
    if pad_multiple < 1:
        raise click.UsageError(f"--pad-multiple {pad_multiple} must be 1 or more")
    if capacity % pad_multiple:
        fits = capacity - capacity % pad_multiple
        raise click.UsageError(
            f"--pad-multiple {pad_multiple} does not divide --capacity {capacity}: use "
            f"--capacity {fits} or a --pad-multiple that divides {capacity}"
        )
    try:
        if isinstance(processor, (str, Path)):
            return PackingTaskEncoder(processor=str(processor), **knobs)
        if processor is not None:  # a processor object (the demo's tiny offline one)
            return PackingTaskEncoder(processor=processor, **knobs)
        return PackingTaskEncoder(tokenizer=tokenizer, **knobs)
    except (ValueError, TypeError) as e:  # the config's own checks: name the flags
        raise click.UsageError(_flag_names(" ".join(str(e).split()))) from None


@main.command()
@click.argument(
    "path", type=click.Path(exists=True, file_okay=False, path_type=Path), callback=_prepared
)
@_encoder_options
@click.option(
    "--buffer", "buffers", multiple=True, type=int, default=(64, 256, 1024), show_default=True
)
@click.option(
    "--algorithm",
    "algorithms",
    multiple=True,
    type=click.Choice(list(ALGORITHMS)),
    help="Only these algorithms (default: all).",
)
@click.option("--skips", type=click.Path(dir_okay=False, path_type=Path), help=_SKIPS_HELP)
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
    skips,
) -> None:
    """Packing table of a prepared dataset, per algorithm and buffer, and a recommendation."""
    _quiet(progress=True)
    from energon_packing.packing import ALGORITHMS
    from energon_packing.tools.report import (
        capacity_hint,
        format_pack_costs,
        format_skipped,
        format_table,
        format_tokens,
        measure_costs,
        packing_table,
        recommend,
        unbounded_costs,
    )

    te = _encoder(capacity, pad_multiple, max_pixels, overlong, tokenizer, processor)
    if skips is not None:
        te.stats.all_skips = []
    measured = measure_costs(path, te, progress=True)
    if skips is not None:
        _write_skips(skips, te.stats.all_skips)
    if not measured.costs:
        _nothing_to_pack(path, te, capacity, pad_multiple, max_pixels, tokenizer, processor)
    media = format_tokens(measured)
    click.echo(
        f"{path}: {len(measured.costs)} conversations, {sum(measured.lengths):,} real tokens"
        f"{f' ({media})' if media else ''}, C={capacity}, pad_multiple={pad_multiple}"
    )
    click.echo(format_skipped(measured.skipped, te.stats.skipped_keys))
    total = len(measured.costs) + sum(measured.skipped.values())
    if measured.skipped.get("overlong", 0) > 0.01 * total:  # measure them with room to spare
        every = unbounded_costs(
            path,
            lambda width: _encoder(width, pad_multiple, max_pixels, overlong, tokenizer, processor),
            pad_multiple=pad_multiple,
        )
        hint = capacity_hint(every, capacity=capacity, pad_multiple=pad_multiple, total=total)
        if hint:
            click.echo(hint)
    rows = packing_table(measured, algorithms=algorithms or ALGORITHMS, buffers=buffers)
    click.echo(format_table(rows))
    click.echo(recommend(rows))
    click.echo(format_pack_costs(measured, te.cost_model, buffer=max(buffers or (256,))))


@main.command("account")
@click.argument(
    "path", type=click.Path(exists=True, file_okay=False, path_type=Path), callback=_prepared
)
@_encoder_options
@click.option("--buffer", default=64, show_default=True)
@click.option("--workers", default=0, show_default=True, help="Loader workers.")
def account_command(
    path: Path, capacity, pad_multiple, max_pixels, overlong, tokenizer, processor, buffer, workers
) -> None:
    """Prove every record exactly once on a prepared folder: one finite epoch of its train and
    val splits through the real loader, every pack's source_ids and every skip counted against
    OUT/convert_map.jsonl. Exits 1 when a key is seen twice, never, or is no record's."""
    _quiet()
    from energon_packing.tools.account import account

    te = _encoder(capacity, pad_multiple, max_pixels, overlong, tokenizer, processor)
    result = account(path, te, num_workers=workers, packing_buffer_size=buffer)
    click.echo(f"{path}: {result.summary()}")
    if not result.exactly_once:
        raise SystemExit(1)


@main.command()
@click.argument(
    "path", type=click.Path(exists=True, file_okay=False, path_type=Path), callback=_prepared
)
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
    """Print the first packs (segments, boundaries, image and video owners, the video tokens'
    spans) and draw them."""
    import itertools

    _quiet()
    from energon_packing.loader.loading import epoch
    from energon_packing.schema import is_empty
    from energon_packing.tools.picture import describe, draw, pack_segments
    from energon_packing.tools.report import audio_token_id, format_skipped, video_token_id

    te = _encoder(capacity, pad_multiple, max_pixels, overlong, tokenizer, processor, carry=carry)
    skipped: dict[str, list[str]] = {}

    def packs():
        for batch in epoch(path, te, packing_buffer_size=buffer):
            for key, reason in batch.get("packing_skipped", ()):
                skipped.setdefault(reason, []).append(key)
            if not is_empty(batch):  # zero-row batches carry skips only
                yield batch

    batches = list(itertools.islice(packs(), count))
    if not batches:
        _nothing_to_pack(path, te, capacity, pad_multiple, max_pixels, tokenizer, processor)
    video_pad, audio_pad = video_token_id(te), audio_token_id(te)
    layouts = [
        pack_segments(
            b, 0, image_pad_id=te.image_token_id, video_pad_id=video_pad, audio_pad_id=audio_pad
        )
        for b in batches
    ]
    click.echo(describe(layouts))
    if skipped:  # read while filling the buffer for these packs
        counts = {reason: len(keys) for reason, keys in skipped.items()}
        click.echo("while packing these, " + format_skipped(counts, skipped))
    draw(layouts, picture, title=f"{path.name}: first {len(layouts)} packs (C={capacity})")
    click.echo(f"picture: {picture}")


@main.command()
@_data_option()
@click.option("--steps", default=16, show_default=True)
@click.option("--capacity", default=2048, show_default=True)
@click.option("--buffer", default=64, show_default=True)
@click.option("--lr", default=3e-3, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--hidden", default=128, show_default=True, help="TinyVLM width (layers: 2, heads: 4)."
)
@click.option("--warmup", default=2, show_default=True, help="Leading steps not timed.")
@click.option(
    "--threads",
    default=1,
    show_default=True,
    help="torch threads (1: a step's time is its own work, not waits for a busy core).",
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
    warmup: int,
    threads: int,
    picture: Path,
) -> None:
    """Train the tiny model on the same conversations through loader packs, trainer packs and
    padded batches, in turn step by step; print tokens/s, losses and the FLOPs per real token
    that predict the speed-up; plot loss vs step and vs time."""
    _quiet()
    if data is None:
        raise click.UsageError("no bundled sample_data next to this install; pass --data PATH")
    import torch

    from energon_packing import PackingTaskEncoder
    from energon_packing.testing.model import TinyConfig
    from energon_packing.tools.bench import PATHS, plot, prepare, report, train

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    te = PackingTaskEncoder(
        max_input_seq_length=capacity, tokenizer="bundled", pad_multiple=8, carry=True
    )
    inputs = prepare(data, te, steps=steps, buffer=buffer)
    config = TinyConfig(vocab_size=te.tokenizer.vocab_size, hidden=hidden, mlp=4 * hidden)
    curves = train(dict(zip(PATHS, inputs)), config=config, seed=seed, lr=lr, warmup=warmup)
    reference = curves[0].losses
    click.echo(
        f"TinyVLM (hidden {hidden}), {len(reference)} steps of the same conversations, "
        f"C={capacity}, lr={lr}, seed={seed}, {threads} torch thread(s); tokens/s: real tokens "
        f"per median step time, the first {curves[0].warmup} steps not timed\n"
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
    click.echo("\n" + report(curves, config=config))
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
@click.option(
    "--allow-losses",
    is_flag=True,
    help="Go on when conversations would vanish below the loader: cut shards cut mid-member "
    "back to their whole samples and list the lost conversations in "
    ".nv-meta/energon_packing_losses.json (the loader's skip report carries them).",
)
def prepare_command(path: Path, split_parts, allow_losses: bool) -> None:
    """Check every shard (as `check` does), run `energon prepare` and write our dataset yamls."""
    from energon_packing.incoming.prepare import (
        ShardLossError,
        SplitPatternError,
        prepare_dataset,
    )

    try:
        written = prepare_dataset(path, split_parts=split_parts, allow_losses=allow_losses)
    except SplitPatternError as e:
        raise click.BadParameter(str(e), param_hint="'--split-parts'") from None
    except FileNotFoundError as e:
        raise click.UsageError(str(e)) from None
    except ShardLossError as e:
        hint = (
            f"; see `energon-packing check {path}`, pass --allow-losses to go on"
            if not e.scan.repeated_apart and not e.scan.empty
            else f"; see `energon-packing check {path}`"
        )
        raise click.ClickException(str(e) + hint) from None
    for name in written:
        click.echo(f"wrote {name}")
    from energon_packing.incoming.shards import load_losses

    losses = load_losses(path)
    if losses:
        click.echo(
            f"{len(losses)} conversation(s) lost in the shards are listed in the losses file; "
            f"the loader's skip report carries them"
        )


@main.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--limit", default=50, show_default=True, help="Findings listed (all are counted).")
@click.option(
    "--decode/--no-decode",
    default=True,
    show_default=True,
    help="Decode every image a document lists, as the loader will (a truncated or broken "
    "image is listed before training); --no-decode is faster.",
)
@click.option(
    "--videos/--no-videos",
    default=True,
    show_default=True,
    help="Also read every video part's container header (its bytes are read, no frame is "
    "decoded): a clip the loader would skip is listed before training.",
)
@click.option(
    "--audio/--no-audio",
    default=True,
    show_default=True,
    help="Also read every audio part's length as the loader will (the header where exact, "
    "else a decode): a clip the loader would skip is listed before training.",
)
@click.option(
    "--video-tracks/--no-video-tracks",
    default=False,
    show_default=True,
    help="Also read every video's own audio track, as a run with audio_config="
    "{'load_audio_from_video': True} (Qwen2.5-Omni, Qwen3-Omni) will: a silent video is "
    "listed (audio_no_stream) before training.",
)
@click.option("--skips", type=click.Path(dir_okay=False, path_type=Path), help=_SKIPS_HELP)
def check(
    path: Path,
    limit: int,
    decode: bool,
    videos: bool,
    audio: bool,
    video_tracks: bool,
    skips: Path | None,
) -> None:
    """Read every tar header of every shard under PATH; list what Energon or WebDataset would
    drop, with shard, offset, key and reason, and every image that does not decode, every
    video whose header does not read and every audio clip that does not read. Exits 1 when
    anything would be lost or skipped."""
    from energon_packing.incoming.shards import scan_dataset, shard_paths
    from energon_packing.tools.report import format_scan

    if not shard_paths(path):
        raise click.UsageError(f"{path} holds no .tar shards (searched **/*.tar)")
    start = time.perf_counter()
    scan = scan_dataset(path)
    click.echo(format_scan(scan, seconds=time.perf_counter() - start, limit=limit))
    if video_tracks and not videos:
        raise click.UsageError("--video-tracks reads the videos' tracks: drop --no-videos")
    unreadable = _check_media(
        path, limit, images=decode, videos=videos, audios=audio, tracks=video_tracks
    )
    if skips is not None:
        _write_skips(
            skips,
            (
                {"key": f.key, "reason": f.reason, "detail": f.detail, "shard": f.shard,
                 "offset": f.offset, "member": f.member}
                for f in [*scan.findings, *unreadable]
            ),
        )  # fmt: skip
    if scan.empty:
        names = ", ".join(s.shard for s in scan.empty[:5])
        click.echo(
            f"\n{len(scan.empty)} shard(s) without one whole sample ({names}): Energon's "
            f"prepare fails the whole dataset on them ('Shard ... has no samples')"
        )
    if scan.findings or scan.empty:
        if scan.repeated_apart:
            advice = "energon prepare refuses keys repeated apart: rename them in the shards"
        elif scan.losses or scan.cut:
            advice = (
                f"`energon-packing prepare {path}` refuses this; with --allow-losses it cuts "
                f"cut shards back and lists the lost conversations in the losses file"
            )
        else:
            advice = "the loader reports these samples itself (nothing vanishes uncounted)"
        if scan.findings:
            click.echo(f"\n{len(scan.findings):,} finding(s): {advice}")
        raise SystemExit(1)
    if unreadable:
        raise SystemExit(1)


def _write_skips(file: Path, rows) -> None:
    """``--skips FILE``: one JSON object per line; says where and how many."""
    import json

    count = 0
    with open(file, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    click.echo(f"{count:,} skipped key(s) with their reasons in {file}")


def _check_media(
    path: Path, limit: int, *, images: bool, videos: bool, audios: bool, tracks: bool = False
) -> list:
    """``check``'s media pass (:func:`energon_packing.incoming.media_check.scan_media`): prints
    what it read and the images, videos and clips the loader would skip; returns those."""
    if not images and not videos and not audios:
        return []
    from energon_packing.incoming.media_check import scan_media

    start = time.perf_counter()
    try:
        found = scan_media(path, images=images, videos=videos, audios=audios, tracks=tracks)
    except ImportError as e:  # PyAV: the [video] extra
        click.echo(
            f"\nvideo headers and audio lengths not read ({e}); pip install 'av>=14' (the "
            "[video] extra: pip install '.[video]' in the checkout, or the built wheel with "
            "[video])"
        )
        if not images:
            return []
        found = scan_media(path, images=True, videos=False, audios=False)
    counts = ((found.images, "image"), (found.videos, "video"), (found.audios, "audio"))
    if not any(n for n, _ in counts):
        return []
    what = " and ".join(f"{n:,} {kind} parts" for n, kind in counts if n)
    click.echo(
        f"\n{what} ({found.bytes / 1e6:,.1f} MB) read in {time.perf_counter() - start:.1f} s: "
        + (f"{len(found.findings):,} unreadable" if found.findings else "every one reads")
    )
    for f in found.findings[:limit]:
        click.echo(f"  {f.shard} @ {f.offset:,}  {f.key}  {f.reason}: {f.detail}")
    if found.findings:
        click.echo("the loader skips these conversations, counted under these reasons")
    return found.findings


@main.command("convert")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "llava", "sharegpt", "messages", "hf", "swift", "alpaca"]),
    default="auto",
    show_default=True,
    help="The records' format; auto decides record by record.",
)
@click.option(
    "--columns",
    default=None,
    help="The record keys that hold what convert reads: messages=conv,images=imgs,... "
    '(or ms-swift\'s JSON \'{"conv": "messages"}\').',
)
@click.option(
    "--dataset-info",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="LLaMA-Factory's dataset_info.json: the --dataset entry's file_name (under SOURCE, "
    "its dataset_dir), formatting, columns and tags.",
)
@click.option("--dataset", default=None, help="The entry of --dataset-info to convert.")
@click.option(
    "--media-root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Where relative image and video paths point (default: SOURCE's folder).",
)
@click.option(
    "--val-fraction",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.0,
    show_default=True,
    help="Records (evenly spread) that go to a val split, disjoint from train.",
)
@click.option(
    "--val-file",
    "val_files",
    multiple=True,
    help="A source file (its path relative to SOURCE) whose records all go to val; repeatable.",
)
@click.option("--samples-per-shard", default=1000, show_default=True, type=click.IntRange(1))
@click.option(
    "--min-converted",
    type=click.FloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="Fail (exit 1, one line saying why) when fewer of the records read convert.",
)
@click.option("--overwrite", is_flag=True, help="Replace OUT when an earlier convert wrote it.")
@click.option("--strict", is_flag=True, help="Exit 1 when any record is reported.")
@click.option(
    "--decode/--no-decode",
    default=True,
    show_default=True,
    help="Decode every image and read every video's container header, as the loader will "
    "(a corrupt one is reported now, not at training time); --no-decode is faster.",
)
@click.option(
    "--workers",
    type=click.IntRange(1),
    default=None,
    help="Threads decoding images (default: the CPUs convert may run on, at most 8); the "
    "output is the same for any number.",
)
def convert_command(
    source: Path,
    out: Path,
    fmt: str,
    columns,
    dataset_info,
    dataset,
    media_root,
    val_fraction,
    val_files,
    samples_per_shard,
    min_converted,
    overwrite,
    strict,
    decode,
    workers,
) -> None:
    """Convert LLaVA / ShareGPT / InternVL JSON, messages JSONL (OpenAI, ms-swift,
    LLaMA-Factory, Mantis, qwen-vl-utils, TRL) or a Hugging Face dataset into prepared Energon
    shards at OUT; records not converted go to OUT/convert_report.jsonl, every converted
    record's key to OUT/convert_map.jsonl. Exits 1 when nothing (or less than
    --min-converted) converts, saying why."""
    from energon_packing.incoming.convert import MAP_FILE, REPORT_FILE, ConvertError, convert

    if dataset_info is not None and dataset is None:
        raise click.UsageError("--dataset-info needs --dataset NAME (the entry to convert)")
    _quiet(progress=True)
    try:
        result = convert(
            source=source,
            out=out,
            format=fmt,
            columns=columns,
            dataset_info=dataset_info,
            dataset=dataset,
            media_root=media_root,
            val_fraction=val_fraction,
            val_files=tuple(val_files),
            samples_per_shard=samples_per_shard,
            min_converted=min_converted,
            overwrite=overwrite,
            progress=True,
            decode=decode,
            workers=workers,
        )
    except ConvertError as e:
        raise click.ClickException(str(e)) from None
    except (FileExistsError, FileNotFoundError, ValueError, ImportError) as e:
        raise click.UsageError(" ".join(str(e).split())) from None
    reported = ", ".join(f"{reason} {n:,}" for reason, n in sorted(result.reported.items()))
    click.echo(
        f"converted {result.converted:,} records (train {result.train:,}, val {result.val:,}) "
        f"into {len(result.shards)} shard(s) under {out / 'shards'}; reported "
        f"{result.total_reported:,}{f' ({reported})' if reported else ''} in "
        f"{out / REPORT_FILE}; keys in {out / MAP_FILE}"
    )
    click.echo(f"prepared: energon-packing stats {out}")
    if strict and result.total_reported:
        raise SystemExit(1)
