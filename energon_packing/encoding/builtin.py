"""Conversation -> token ids, loss mask and media placeholders (ChatML + Qwen2-VL vision tokens).

    <|im_start|>user\\n<|vision_start|><|image_pad|> x N<|vision_end|>What is red?<|im_end|>\\n
    <|im_start|>assistant\\nThe circle.<|im_end|>\\n
                           ^^^^^^^^^^^^^^^^^^^^^^^ token_mask = loss weight, 0 elsewhere

N = t*h*w/4 for an image of grid (t, h, w), computed from the image *header*; a video is
``<|vision_start|><|video_pad|> x N<|vision_end|>`` with its grid from the container header
(Qwen2-VL's video processor rules: :class:`~.chat.VideoCosting`). Nothing is decoded here;
:meth:`BuiltinChat.sources` decodes for the pack being emitted. The default path: no
transformers needed. Pure: no Energon, no torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from energon_packing.encoding.chat import (
    IMAGE,
    WHOLE_MESSAGES,
    Skip,
    VideoCosting,
    audio_lengths,
    decode_once,
    fit_to_capacity,
    image_sizes,
    read_conversation,
    video_plans,
)
from energon_packing.encoding.families import audio_families
from energon_packing.encoding.positions import MRope, mrope_positions
from energon_packing.encoding.tokenizer import ChatTokenizer
from energon_packing.encoding.vision import VisionConfig, grid_for, patchify, tokens_for
from energon_packing.media.video_styles import QWEN2_VL
from energon_packing.schema import IMAGE_GRID_THW, PIXEL_VALUES, Source

if TYPE_CHECKING:
    from energon_packing.config import PackingConfig

__all__ = ["BuiltinChat", "Encoding", "encode"]

#: The mRoPE fields a fingerprint covers (its others follow from the tokenizer and knobs).
_MROPE_FIELDS = ("vision_start_id", "image_pad_id", "merge_size")


@dataclass(kw_only=True, slots=True)
class Encoding:
    input_ids: list[int]
    token_mask: list[float]
    #: indices into the document's ``images`` list, in order of appearance in the text
    image_order: list[int] = field(default_factory=list)
    grids: list[tuple[int, int, int]] = field(default_factory=list)
    #: indices into the document's ``videos`` list, in order of appearance
    video_order: list[int] = field(default_factory=list)
    #: each video's plan from its header (:class:`~.chat.VideoCosting`), in the same order
    video_plans: list = field(default_factory=list)
    #: tokens removed by ``overlong="truncate"``
    truncated: int = 0

    @property
    def length(self) -> int:
        return len(self.input_ids)


def encode(
    *,
    key: str,
    messages: Sequence[Any],
    image_names: Sequence[str],
    images: Mapping[str, bytes],
    video_names: Sequence[str] = (),
    videos: Mapping[str, bytes] | None = None,
    audio_names: Sequence[str] = (),
    audios: Mapping[str, bytes] | None = None,
    loss_weight: float,
    tokenizer: ChatTokenizer,
    config: PackingConfig,
    video_side: VideoCosting | None = None,
) -> Encoding:
    """Encodes one conversation, or raises :class:`Skip` / :class:`OverlongError`.

    Work is linear in the conversation's size and bounded by ``config.limits`` before anything
    is tokenized; images are costed from their headers (pixel budget included).
    """
    c = read_conversation(
        messages=messages,
        image_names=image_names,
        video_names=video_names,
        audio_names=audio_names,
        loss_weight=loss_weight,
        config=config,
        find_special=tokenizer.find_special,
    )
    audio_lengths(  # missing_audio first, then unsupported_audio: nothing is decoded
        c.audios,
        audio_names=audio_names,
        audios=audios or {},
        takes_audio=(
            "the built-in layout takes no audio; pass processor= of a family whose processor "
            f"takes audio ({', '.join(audio_families())})"
        ),
        max_seconds=None,
    )
    special = tokenizer.special
    if c.videos.order and special.video_pad is None:
        raise Skip(
            "unsupported_video",
            f"tokenizer {tokenizer.name} has no <|video_pad|> token, which videos need",
        )
    plans = video_plans(
        c.videos,
        video_names=video_names,
        videos=videos or {},
        side=video_side,
        layout="this layout (no video side: the task encoder attaches one)",
    )
    vision = config.vision
    grids = [
        grid_for(width, height, vision)
        for width, height in image_sizes(
            c.refs, image_names=image_names, images=images, max_pixels=config.max_image_pixels
        )
    ]

    ids: list[int] = []
    mask: list[float] = []
    media_end = 0  # the token after the last image or video
    newline = tokenizer.encode_fixed("\n")
    grid_iter, plan_iter = iter(grids), iter(plans)

    def emit(tokens: Sequence[int], weight: float) -> None:
        ids.extend(tokens)
        mask.extend([weight] * len(tokens))

    whole = config.train_on in WHOLE_MESSAGES  # role header and trailing newline train too
    for t, (role, pieces) in enumerate(c.turns):
        trains = c.weight if t in c.trained else 0.0
        emit([special.im_start, *tokenizer.encode_fixed(role + "\n")], trains if whole else 0.0)
        for piece in pieces:
            if isinstance(piece, str):
                emit(tokenizer.encode(piece), trains)  # plain text: never a special id
            else:  # images and videos are context, never trained
                if piece.kind == IMAGE:
                    pads = [special.image_pad] * tokens_for(next(grid_iter), vision)
                else:
                    pads = [special.video_pad] * next(plan_iter).tokens
                emit([special.vision_start, *pads, special.vision_end], 0.0)
                media_end = len(ids)
        emit([special.im_end], trains)
        emit(newline, trains if whole else 0.0)
    mask[0] = 0.0  # no source predicts across a pack boundary
    encoding = Encoding(
        input_ids=ids,
        token_mask=mask,
        image_order=c.refs.order,
        grids=grids,
        video_order=c.videos.order,
        video_plans=plans,
    )
    return fit_to_capacity(encoding, key=key, media_end=lambda: media_end, config=config)


class BuiltinChat:
    """The built-in layout (ChatML + Qwen2-VL vision tokens) over a :class:`ChatTokenizer`:
    what a conversation costs (:meth:`encode`) and what it becomes in a pack (:meth:`source`)."""

    family_name = "builtin"
    clips_alone = False  # it takes no audio
    row_break_id = None  # an image's tokens are one run

    def image_tiles(self, sizes: list[list[tuple[int, int]]]) -> list[int]:
        """None of its images is tiled (their grids price them)."""
        return []

    #: the video processor whose rules the built-in layout follows (Qwen2-VL's)
    video_style = QWEN2_VL

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        *,
        mrope: bool,
        vision: VisionConfig | None = None,
        videos: VideoCosting | None = None,
    ):
        self.tokenizer = tokenizer
        self.vision = vision
        self.videos = videos
        special = tokenizer.special
        self.pad_id = special.pad
        self.image_token_id = special.image_pad
        self.mrope = (
            MRope(
                vision_start_id=special.vision_start,
                image_pad_id=special.image_pad,
                video_pad_id=special.video_pad,
            )
            if mrope
            else None
        )

    def __repr__(self) -> str:
        return f"BuiltinChat({self.tokenizer.name})"

    @property
    def fingerprint(self) -> str:
        """A short digest of what decides ids, masks and pixels on this path: the tokenizer's
        identity (:attr:`ChatTokenizer.fingerprint`), its special ids, the vision settings and
        mRoPE. Equal across processes for equal inputs."""
        parts = {
            "layout": self.family_name,
            "tokenizer": self.tokenizer.fingerprint,
            "special": asdict(self.tokenizer.special),
            "vision": asdict(self.vision) if self.vision is not None else None,
            # the fields of release 0.4 (a video pad id comes from the tokenizer, above)
            "mrope": {k: v for k, v in asdict(self.mrope).items() if k in _MROPE_FIELDS}
            if self.mrope is not None
            else None,
        }
        blob = json.dumps(parts, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def encode(self, *, config: PackingConfig, **fields: Any) -> Encoding:
        return encode(tokenizer=self.tokenizer, config=config, video_side=self.videos, **fields)

    def sources(
        self, *, items: Sequence[Mapping[str, Any]], config: PackingConfig
    ) -> list[Source | Exception]:
        """:meth:`source` of each of one pack's conversations (``items``: its keyword
        arguments), or the exception that conversation alone fails with."""
        out: list[Source | Exception] = []
        for item in items:
            try:
                out.append(self.source(config=config, **item))
            except Exception as e:
                out.append(e)
        return out

    def empty_media(self, config: PackingConfig) -> dict[str, np.ndarray]:
        """The media of a pack without images (the built-in path always has both keys)."""
        return {
            PIXEL_VALUES: np.zeros((0, config.vision.patch_dim), dtype=np.float32),
            IMAGE_GRID_THW: np.zeros((0, 3), dtype=np.int64),
        }

    def source(
        self,
        *,
        key: str,
        input_ids: np.ndarray,
        token_mask: np.ndarray,
        images: Sequence[bytes],
        config: PackingConfig,
        videos: Sequence[bytes] = (),
        video_plans: Sequence[Any] = (),
        **_: Any,
    ) -> Source:
        """Decodes the conversation's images and videos and checks its tokens against them.

        Raises:
            Skip: an image or a video does not decode (a data skip).
            ValueError: the tokens do not match the media (a bug: it would corrupt its pack).
        """
        vision = config.vision  # built and validated on each access: once per conversation
        decoded = decode_once(
            lambda data: patchify(
                data,
                vision,
                max_pixels=config.max_image_pixels,
                high_bit_depth=config.high_bit_depth,
            ),
            images,
        )
        grids = [grid for _, grid in decoded]
        plans = list(video_plans) or [self.videos.plan(data) for data in videos]
        clips = decode_once(self.videos.media, videos, plans)
        special, ids = self.tokenizer.special, np.asarray(input_ids)
        starts = int((ids == special.vision_start).sum())
        pads = int((ids == special.image_pad).sum())
        need = sum(tokens_for(g, vision) for g in grids)
        video_pads = int((ids == special.video_pad).sum()) if videos else 0
        video_need = sum(p.tokens for p in plans)
        if starts != len(grids) + len(plans) or pads != need or video_pads != video_need:
            raise ValueError(
                f"{starts} vision-start, {pads} image-pad and {video_pads} video-pad tokens for "
                f"{len(grids)} image(s) that need {need} and {len(plans)} video(s) that need "
                f"{video_need}"
            )
        media = self.empty_media(config)
        if decoded:
            media = {
                PIXEL_VALUES: np.concatenate([p for p, _ in decoded]),
                IMAGE_GRID_THW: np.asarray(grids, dtype=np.int64).reshape(-1, 3),
            }
        for name in clips[0] if clips else ():
            media[name] = np.concatenate([clip[name] for clip in clips])
        positions = None
        if self.mrope:
            positions = mrope_positions(ids, grids, self.mrope, videos=plans)
        return Source(
            key=key,
            input_ids=input_ids,
            token_mask=token_mask,
            positions=positions,
            media=media,
            images=len(grids),
            videos=len(plans),
        )
