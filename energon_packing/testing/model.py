"""A tiny but real VLM that consumes the shim's microbatches (CPU, a few layers, seeded init).

Token embedding; a vision path whose merged 2x2 patch features replace the image-pad token
embeddings (as Qwen2-VL merges vision features); rotary positions from ``position_ids`` (1-D,
or Qwen2-VL's 3-row mRoPE with ``mrope_section``); causal attention that sees only what the
varlen parameters allow (``cu_seqlens``: no attention across sources), computed source by
source as a varlen kernel does (its cost: the sum over sources, see :func:`attention_calls`).
Under context parallelism each rank holds its chunks of every source and all-gathers K/V
(forward only).

It exists to prove that the kernel cannot tell loader packs from trainer packs (tests,
``energon-packing bench``); it is not a model to train for quality.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from energon_packing.trainer.shim import cp_indices

__all__ = ["TinyConfig", "TinyVLM", "attention_calls"]


@dataclass(kw_only=True, slots=True, frozen=True)
class TinyConfig:
    vocab_size: int
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    mlp: int = 128
    patch_dim: int = 1176
    vision_hidden: int = 32
    merge_size: int = 2
    mrope_section: tuple[int, int, int] | None = None  # e.g. (2, 3, 3): sums to head_dim / 2
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary(nn.Module):
    def __init__(self, config: TinyConfig):
        super().__init__()
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.section = config.mrope_section
        if self.section is not None and sum(self.section) != dim // 2:
            raise ValueError(f"mrope_section {self.section} must sum to head_dim/2 = {dim // 2}")

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [B, T]`` or ``[3, B, T]`` -> cos, sin ``[B, T, head_dim]``."""
        if position_ids.ndim == 3:
            if self.section is None:
                raise ValueError("3-row position_ids need a model with mrope_section")
            freqs = position_ids.to(torch.float64)[..., None] * self.inv_freq  # [3, B, T, d/2]
            rows = torch.repeat_interleave(torch.arange(3), torch.tensor(self.section))
            freqs = freqs[rows, :, :, torch.arange(len(rows))].permute(1, 2, 0)  # [B, T, d/2]
        else:
            freqs = position_ids.to(torch.float64)[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, config: TinyConfig):
        super().__init__()
        self.heads, self.head_dim = config.heads, config.head_dim
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)
        self.out = nn.Linear(config.hidden, config.hidden)

    def forward(self, x, cos, sin, params) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.heads, self.head_dim).unbind(2)
        q = q * cos[:, :, None] + _rotate_half(q) * sin[:, :, None]
        k = k * cos[:, :, None] + _rotate_half(k) * sin[:, :, None]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        if params is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = _varlen_attention(q, k, v, params)
        return self.out(y.transpose(1, 2).reshape(batch, tokens, -1))


def _segments(params: Any) -> list[tuple[int, int, int]]:
    """``(start, valid_length, padded_length)`` of every source, from the varlen params only:
    ``cu_seqlens_q_padded`` places each source in the row; ``cu_seqlens_q`` gives the length of
    its real part when padding sits between sources (else the whole padded extent counts)."""
    padded = params.cu_seqlens_q_padded.tolist()
    lengths = params.cu_seqlens_q.tolist()
    between = lengths != padded
    out = []
    for i in range(len(padded) - 1):
        extent = padded[i + 1] - padded[i]
        valid = lengths[i + 1] - lengths[i] if between else extent
        out.append((padded[i], valid, extent))
    return out


def attention_calls(packed_seq_params: Any, *, rows: int, tokens: int) -> list[tuple[int, int]]:
    """``(queries, keys)`` of every attention kernel call one layer makes (per head): one per
    row for padded rows (``packed_seq_params=None``), one per source for a pack (under CP: the
    rank's share of the source's queries against all of its keys). Its cost is the sum over
    calls of queries x keys, what a varlen kernel pays; the bench counts FLOPs from this."""
    if packed_seq_params is None:
        return [(tokens, tokens)] * rows
    cp_size = int(packed_seq_params.cu_seqlens_q_padded[-1]) // tokens
    return [(extent // cp_size, valid) for _, valid, extent in _segments(packed_seq_params)]


def _flash_varlen(q, k, v, params) -> torch.Tensor | None:
    """flash-attention's varlen kernel over the whole pack, where it can run (a GPU, half
    precision, the ``flash_attn`` package, padded boundaries, no CP); else None."""
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
        return None
    if not torch.equal(params.cu_seqlens_q, params.cu_seqlens_q_padded):
        return None
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    cu = params.cu_seqlens_q_padded.to(device=q.device, dtype=torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))  # [T, H, D]
    y = flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True)
    return y.transpose(0, 1).unsqueeze(0)


def _varlen_attention(q, k, v, params) -> torch.Tensor:
    """Causal attention inside each source, one SDPA call per source (or flash-attention's
    varlen kernel), so the cost is the sum over sources, never the whole row squared. With CP,
    K/V of all ranks are all-gathered and every query keeps its position in its source."""
    if q.shape[0] != 1:
        raise ValueError("packed rows come one per microbatch (batch dimension 1)")
    padded = params.cu_seqlens_q_padded
    cp_size = int(padded[-1]) // q.shape[2]  # this rank holds 1/cp_size of the row
    if cp_size > 1:
        group = params.cp_group
        local = cp_indices(padded, cp_size, torch.distributed.get_rank(group))
        owners = torch.cat([cp_indices(padded, cp_size, r) for r in range(cp_size)])
        gathered_k = [torch.empty_like(k) for _ in range(cp_size)]
        gathered_v = [torch.empty_like(v) for _ in range(cp_size)]
        torch.distributed.all_gather(gathered_k, k.contiguous(), group=group)
        torch.distributed.all_gather(gathered_v, v.contiguous(), group=group)
        order = torch.argsort(owners)
        k = torch.cat(gathered_k, dim=2)[:, :, order]
        v = torch.cat(gathered_v, dim=2)[:, :, order]
    else:
        flash = _flash_varlen(q, k, v, params)
        if flash is not None:
            return flash
        local = torch.arange(q.shape[2])
    outputs, offset = [], 0  # a rank's queries come source by source (cp_indices' order)
    for start, valid, extent in _segments(params):
        queries = q[:, :, offset : offset + extent // cp_size]
        keys, values = k[:, :, start : start + valid], v[:, :, start : start + valid]
        if valid == 0:  # no real token to attend to
            outputs.append(torch.zeros_like(queries))
        elif cp_size == 1 and valid == extent:
            outputs.append(F.scaled_dot_product_attention(queries, keys, values, is_causal=True))
        else:  # CP chunks or padding after the real part: explicit causal positions
            where = local[offset : offset + queries.shape[2]] - start
            allowed = (torch.arange(valid)[None, :] <= where[:, None]).to(q.device)
            outputs.append(F.scaled_dot_product_attention(queries, keys, values, attn_mask=allowed))
        offset += queries.shape[2]
    return torch.cat(outputs, dim=2)


class Block(nn.Module):
    def __init__(self, config: TinyConfig):
        super().__init__()
        self.norm1 = nn.RMSNorm(config.hidden)
        self.attn = Attention(config)
        self.norm2 = nn.RMSNorm(config.hidden)
        self.mlp = nn.Sequential(
            nn.Linear(config.hidden, config.mlp), nn.GELU(), nn.Linear(config.mlp, config.hidden)
        )

    def forward(self, x, cos, sin, params):
        x = x + self.attn(self.norm1(x), cos, sin, params)
        return x + self.mlp(self.norm2(x))


class TinyVLM(nn.Module):
    """``forward(input_ids, position_ids, packed_seq_params=None, pixel_values=None,
    image_grid_thw=None, vision_token_index=None) -> logits [B, T, vocab]``."""

    def __init__(self, config: TinyConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = config
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.patch = nn.Linear(config.patch_dim, config.vision_hidden)
        merged = config.vision_hidden * config.merge_size**2
        self.merger = nn.Sequential(
            nn.LayerNorm(merged),
            nn.Linear(merged, config.hidden),
            nn.GELU(),
            nn.Linear(config.hidden, config.hidden),
        )
        self.rotary = Rotary(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.RMSNorm(config.hidden)
        self.head = nn.Linear(config.hidden, config.vocab_size, bias=False)
        torch.random.set_rng_state(generator_state)
        self.to(dtype)

    def vision_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[patches, patch_dim]`` -> ``[patches / merge**2, hidden]`` (4 consecutive patch rows
        are one merged token, in the patch order Qwen2-VL's processor emits)."""
        patches = self.patch(pixel_values.to(self.patch.weight.dtype))
        return self.merger(patches.reshape(-1, patches.shape[-1] * self.config.merge_size**2))

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        packed_seq_params: Any = None,
        pixel_values: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
        vision_token_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.embed(input_ids)
        if pixel_values is not None and len(pixel_values):
            if vision_token_index is None:
                raise ValueError(
                    "pixel_values need vision_token_index (pass image_token_id to the shim)"
                )
            features = self.vision_features(pixel_values)
            where = vision_token_index >= 0
            x = x.clone()
            x[where] = features[vision_token_index[where]]
        cos, sin = self.rotary(position_ids)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin, packed_seq_params)
        return self.head(self.norm(x))
