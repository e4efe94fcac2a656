"""Counters and the skip report: nothing is dropped without a count, a key and a reason.

Each skip reason is logged once per process (the first key and why), then only counted; the
counts are exported as a flat ``{"packing/...": number}`` dict that a logger can take.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from energon_packing.errors import LIMIT, cut, quote

__all__ = [
    "KEYS_PER_REASON",
    "REASONS",
    "MetricsAggregator",
    "PackingStats",
    "SkipWarning",
    "metrics_list",
    "reason_table",
]

logger = logging.getLogger("energon_packing")

#: Every reason a sample can be skipped for: the skip report's vocabulary (the README lists it;
#: a test checks that the code emits no other).
REASONS = {
    # reading the shard sample
    "corrupt_shard": "the tar bytes of the sample are unreadable (truncated, overwritten, deleted shard)",
    "unreadable_sample": "reading the sample failed in a way no other reason names",
    # found in the tar headers before training (energon-packing prepare --allow-losses writes
    # them to .nv-meta/energon_packing_losses.json; see energon_packing.incoming.shards)
    "truncated_member": "a tar member cut short: the shard ends inside it (the shard was cut back to its whole samples)",
    "lost_in_shard": "a tar member the tar walk never reaches (after a header whose size lies, after the end-of-archive blocks, or the rest of a cut sample)",
    "duplicate_key": "the same key twice in a row in a shard: WebDataset keeps the later document, the earlier is lost",
    "not_regular_file": "the .json member is a symlink or hardlink: Energon skips it and the sample has no other member",
    "dotted_key": "a .json member whose key holds a dot: WebDataset cuts the key at the first dot and merges it with its neighbours",
    "unreachable_part": "a .json member no sample holds (no key before the dot, or a __meta__ name)",
    "missing_json": "the sample has no .json part",
    "too_large": "the .json part is larger than 16 MiB (not decoded)",
    "non_utf8": "the .json part is not UTF-8",
    "malformed_json": "not JSON, not an object, nested past the recursion limit, or numbers no float holds",
    "missing_messages": "no 'messages' list (nor LLaVA 'conversations'; `energon-packing convert` reads other shapes)",
    "bad_loss_weight": "loss_weight (times the subflavor's) not finite, > 1000, or below float32's smallest normal (1.2e-38; subnormals are 0 in bf16)",
    # the conversation
    "empty_conversation": "'messages' is empty",
    "malformed_message": "a message without role/content, or content of another shape",
    "unknown_role": "a role other than system, user, assistant",
    "invalid_text": "text holding a lone UTF-16 surrogate",
    "special_token_text": "text spelling a special token, with special_token_text='skip'",
    "no_assistant_turn": "nothing to train on",
    "empty_assistant": "the trained assistant turns hold no text",
    "too_many_turns": "more messages than max_turns (checked before tokenizing)",
    "text_too_long": "more characters than max_text_chars (checked before tokenizing)",
    "too_many_images": "more images than max_images",
    "unsupported_media": "inline or remote audio parts ('input_audio', 'audio_url'): name the clip's shard part instead",
    "unsupported_field": "ms-swift grounding 'objects' (the <ref-object> / <bbox> tags they fill would train as text)",
    "template_error": "the processor's chat template refused the conversation (its message), or is not prefix-stable",
    # images
    "missing_image": "an image referenced or listed that the sample does not hold",
    "placeholder_mismatch": "image references and the 'images' list disagree",
    "corrupt_image": "an image whose header or pixels do not decode",
    "image_too_large": "an image over max_image_pixels (read from the header, nothing decoded)",
    "image_aspect_ratio": "an image with an aspect ratio above 200, upright (Qwen2-VL refuses it; e.g. 1600x7 text lines)",
    "unsupported_image": "an image the processor's family cannot take, or an image for a text-only tokenizer",
    # videos
    "missing_video": "a video referenced or listed that the sample does not hold",
    "too_many_videos": "more videos than max_images (the limit on each kind of media)",
    "unsupported_video": "a video for a layout without videos (a family other than Qwen2/2.5/3-VL, a tokenizer without <|video_pad|>, or PyAV not installed)",
    "video_unreadable": "a video part that is no container PyAV opens (header unreadable)",
    "video_no_stream": "a container without a video stream",
    "video_empty": "a video stream without a frame",
    "video_no_fps": "sampling by fps, but the stream declares no frame rate",
    "video_too_short": "fewer frames than the family's sampling needs (e.g. under one temporal patch)",
    "video_aspect_ratio": "frames with an aspect ratio above 200",
    "video_too_large": "a video whose sampling takes more than max_video_frames frames, expands past max_video_tokens, or has frames over max_image_pixels (from its header before any decode; a frame that outgrows its header, before it is converted)",
    "video_corrupt": "a video whose sampled frames do not decode, or decode otherwise than its header says",
    # audio
    "missing_audio": "an audio clip referenced or listed that the sample does not hold",
    "too_many_audios": "more audio clips than max_images (the limit on each kind of media)",
    "unsupported_audio": "an audio clip for a layout whose processor takes none (the detail names the families that do)",
    "audio_unreadable": "an audio part that is no container PyAV opens, or whose stream does not decode",
    "audio_no_stream": "a container without an audio stream, or a stream without a sample",
    "audio_too_short": "a clip shorter than its family's feature window (Phi-4-multimodal: 400 samples, 25 ms), of which its feature extractor makes no frame",
    "audio_too_long": "a clip longer than max_audio_seconds, or than the family's own maximum (Qwen2.5-Omni: 300 s; its processor would cut it silently)",
    # length
    "overlong": "longer than max_input_seq_length after padding (overlong='drop')",
    "overlong_media": "overlong='truncate', but its images, videos or audio clips end past the pack width",
    "overlong_no_trained_token": "overlong='truncate', but nothing trained survives the cut",
    # the unforeseen (bugs): counted toward the 100-in-a-row stop
    "encode_error": "encoding raised an unexpected error",
    "source_error": "a conversation's images or tokens failed at pack time (it alone is dropped)",
    "pack_error": "laying out a pack failed (its members are reported)",
}


def reason_table() -> str:
    """The skip reasons as docs/shards.md lists them (a test compares the two)."""
    rows = ["| reason | the sample |", "|---|---|"]
    rows += [f"| `{reason}` | {text} |" for reason, text in REASONS.items()]
    return "\n".join(rows)


#: Keys remembered per skip reason (the counts are exact, the key lists are samples).
KEYS_PER_REASON = 32
#: Characters of a key or a detail in a log line: a run's log stays small whatever data holds.
LOGGED_CHARS = LIMIT


def metrics_list(metrics: Any) -> list[dict]:
    """A batch's ``packing_metrics`` as a list: a worker's dict, or the list ``align_ranks``
    forwards when it passes accounting-only batches by."""
    if not metrics:
        return []
    return list(metrics) if isinstance(metrics, list) else [metrics]


class SkipWarning(UserWarning):
    """The first skip of each reason in a process, when logging is not set up (so it shows
    without any set-up; ``warnings.filterwarnings("ignore", category=SkipWarning)`` hides it)."""


def _logging_configured() -> bool:
    """Whether a record of the package's logger reaches a real handler (the package itself
    adds only a ``NullHandler``, which would swallow it)."""
    node: Any = logger
    while node is not None:
        if any(not isinstance(h, logging.NullHandler) for h in node.handlers):
            return True
        node = node.parent if node.propagate else None
    return False


def _warn(message: str) -> None:
    if _logging_configured():
        logger.warning(message)
    else:
        warnings.warn(message, SkipWarning, stacklevel=3)


@dataclass(kw_only=True, slots=True)
class PackingStats:
    """What one loader process saw: samples read, skipped (by reason), packed, and the packs."""

    read: int = 0
    skipped: Counter = field(default_factory=Counter)
    skipped_keys: dict = field(default_factory=dict)  # reason -> [key, ...] (first few)
    truncated: int = 0
    truncated_tokens: int = 0
    packs: int = 0
    packed: int = 0
    real_tokens: int = 0
    pack_tokens: int = 0
    carry_events: int = 0  # times a sample went back into the buffer
    carried_emitted: int = 0  # samples that left after waiting >= 1 extra round
    held_rounds_max: int = 0  # the longest wait, in select rounds
    #: modelled training FLOPs of the packs emitted, by component (``StepCostModel``)
    cost_decoder_linear: int = 0
    cost_attention: int = 0
    cost_vision: int = 0
    cost_audio: int = 0
    #: the largest vision share of one pack's modelled cost so far
    vision_share_max: float = 0.0
    worker: int = 0  # the loader worker these numbers belong to (within the rank)
    #: (key, reason) of every skip not yet handed to the trainer inside a batch
    events: list = field(default_factory=list)
    #: When a list: every skip, ``{"key", "reason", "detail"}`` (``stats --skips FILE``);
    #: None (the default) keeps none, so a long run's memory stays flat.
    all_skips: list | None = None

    def skip(self, key: str, reason: str, detail: str) -> None:
        if not self.skipped[reason]:  # once per reason per process (loader worker)
            _warn(
                f"skipping sample {quote(key)} ({reason}: {cut(detail)}); further {reason!r} "
                f"skips are counted, not logged (PackingTaskEncoder.stats, metrics "
                f"packing/skipped/{reason})"
            )
        self.skipped[reason] += 1
        self.events.append((key, reason))
        keys = self.skipped_keys.setdefault(reason, [])
        if len(keys) < KEYS_PER_REASON:
            keys.append(key)
        if self.all_skips is not None:
            self.all_skips.append({"key": key, "reason": reason, "detail": detail})

    def add_pack(self, *, sources: int, real_tokens: int, capacity: int, cost: Any = None) -> None:
        """One emitted pack; ``cost``: its modelled cost by component (a ``PackCost``)."""
        self.packs += 1
        self.packed += sources
        self.real_tokens += real_tokens
        self.pack_tokens += capacity
        if cost is not None:
            self.cost_decoder_linear += cost.decoder_linear
            self.cost_attention += cost.attention
            self.cost_vision += cost.vision
            self.cost_audio += getattr(cost, "audio", 0)
            total = cost.decoder_linear + cost.attention + cost.vision + getattr(cost, "audio", 0)
            if total:
                self.vision_share_max = max(self.vision_share_max, cost.vision / total)

    def add_carry(self, *, carried: int, emitted_counts: list[int]) -> None:
        """One carry round: how many samples stayed, and the carry counts of those that left."""
        self.carry_events += carried
        waited = [c for c in emitted_counts if c]
        self.carried_emitted += len(waited)
        self.held_rounds_max = max([self.held_rounds_max, *waited])

    @property
    def efficiency(self) -> float:
        """Real tokens / pack tokens over every pack emitted so far."""
        return self.real_tokens / self.pack_tokens if self.pack_tokens else 0.0

    def drain(self) -> list[tuple[str, str]]:
        """The skips since the last call (each is handed to the trainer exactly once)."""
        events, self.events = self.events, []
        return events

    def metrics(self) -> dict[str, float]:
        """A flat dict for a metrics logger (wandb, TensorBoard, NeMo-RL's logger)."""
        out: dict[str, float] = {
            "packing/worker": self.worker,
            "packing/read": self.read,
            "packing/packed": self.packed,
            "packing/skipped": sum(self.skipped.values()),
            "packing/truncated": self.truncated,
            "packing/truncated_tokens": self.truncated_tokens,
            "packing/packs": self.packs,
            "packing/real_tokens": self.real_tokens,
            "packing/pack_tokens": self.pack_tokens,
            "packing/efficiency": self.efficiency,
            "packing/samples_per_pack": self.packed / self.packs if self.packs else 0.0,
        }
        if self.cost_decoder_linear:  # TFLOPs: a float keeps them exact enough and loggable
            out["packing/cost/decoder_linear_tflops"] = self.cost_decoder_linear / 1e12
            out["packing/cost/attention_tflops"] = self.cost_attention / 1e12
            out["packing/cost/vision_tflops"] = self.cost_vision / 1e12
            out["packing/cost/vision_share_max"] = self.vision_share_max
            if self.cost_audio:  # a model with an audio encoder, packs with clips
                out["packing/cost/audio_tflops"] = self.cost_audio / 1e12
        if self.carry_events:
            out["packing/carry/events"] = self.carry_events
            out["packing/carry/emitted_after_wait"] = self.carried_emitted
            out["packing/carry/held_rounds_max"] = self.held_rounds_max
        for reason, count in sorted(self.skipped.items()):
            out[f"packing/skipped/{reason}"] = count
        return out


#: Counters that add up across workers (the rest are recomputed or maxed).
_SUMMED = (
    "read",
    "packed",
    "skipped",
    "truncated",
    "truncated_tokens",
    "packs",
    "real_tokens",
    "pack_tokens",
    "carry/events",
    "carry/emitted_after_wait",
    "cost/decoder_linear_tflops",
    "cost/attention_tflops",
    "cost/vision_tflops",
    "cost/audio_tflops",
)


class MetricsAggregator:
    """Trainer side: every worker's packing numbers, summed into one flat dict.

    Each batch carries its worker's cumulative ``packing_metrics`` and the skips since that
    worker's previous batch (``packing_skipped``); feed every batch to :meth:`update`::

        aggregate = MetricsAggregator()
        for batch in loader:
            logger.log(aggregate.update(batch))   # {"packing/read": ..., "packing/efficiency": ...}
    """

    def __init__(self) -> None:
        self._latest: dict[int, dict[str, float]] = {}
        #: every (key, reason) skipped so far, across workers
        self.skipped: list[tuple[str, str]] = []

    def update(self, batch: dict) -> dict[str, float]:
        """Takes one batch's accounting (``packing_metrics`` is a worker's dict, or a list of
        them when ``align_ranks`` forwards the accounting of batches it passed by)."""
        for worker in metrics_list(batch.get("packing_metrics")):
            self._latest[int(worker["packing/worker"])] = worker
        self.skipped.extend(tuple(event) for event in batch.get("packing_skipped", ()))
        return self.metrics()

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for worker in self._latest.values():
            for key, value in worker.items():
                name = key.removeprefix("packing/")
                if name in _SUMMED or name.startswith("skipped/"):
                    out[key] = out.get(key, 0) + value
                elif name in ("carry/held_rounds_max", "cost/vision_share_max"):
                    out[key] = max(out.get(key, 0), value)
        if out:
            out["packing/workers"] = len(self._latest)
            out["packing/efficiency"] = (
                out["packing/real_tokens"] / out["packing/pack_tokens"]
                if (out.get("packing/pack_tokens"))
                else 0.0
            )
            out["packing/samples_per_pack"] = (
                out["packing/packed"] / out["packing/packs"] if (out.get("packing/packs")) else 0.0
            )
        return out
