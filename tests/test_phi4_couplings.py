"""Where Phi-4-multimodal's forward mixes the conversations of one call (issue 32 item 2, issue
33 item 5), measured on transformers' own modeling code with a tiny random model in float64 (its
processor needs torchvision; its model and feature extractor do not): what its family's rules
answer. Each coupling is shown against a control that changes only what the coupling reads:

* its audio encoder (a conformer: convolutions over time) reads the padding of a call: a 2 s
  clip padded to a 5 s one beside it is encoded otherwise than alone, and equal to alone beside
  a clip of its own length;
* its audio projection is the vision-speech one whenever the call holds image pixels, whoever
  they belong to;
* its longrope switches every position to the long factors once the row's largest position
  passes ``original_max_position_embeddings``: a short conversation packed beside a longer one
  is off, beside one under that bound exact (``models.check_rope`` bounds a pack's width).

While any of these stops holding on an installed release, its rule can be revisited.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from energon_packing import PackingTaskEncoder  # noqa: E402
from energon_packing.encoding.families import REFUSED, refusal  # noqa: E402
from energon_packing.encoding.processor_loading import load_processor  # noqa: E402

AUDIO_TOKEN, IMAGE_TOKEN, ORIGINAL = 61, 60, 16
HEAD = 8


def _wave(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(16_000 * seconds)) * 0.1).astype(np.float32)


@pytest.fixture(scope="module")
def tiny():
    """A Phi-4-multimodal of two text layers, one vision and one conformer block, longrope
    with ``original_max_position_embeddings`` 16, its audio normaliser's statistics set (a
    trained model's are not 0 and 1), in float64, eager attention."""
    from transformers import Phi4MultimodalForCausalLM

    from energon_packing.testing.families_phi4 import tiny_config

    torch.manual_seed(0)
    config = tiny_config(
        image_token_id=IMAGE_TOKEN,
        audio_token_id=AUDIO_TOKEN,
        vision={"num_hidden_layers": 1, "image_size": 28, "patch_size": 14, "crop_size": 28},
        vocab_size=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        max_position_embeddings=256,
        original_max_position_embeddings=ORIGINAL,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0] * (HEAD // 2),
            "long_factor": [4.0] * (HEAD // 2),
            "original_max_position_embeddings": ORIGINAL,
            "partial_rotary_factor": 1.0,
        },
    )
    model = Phi4MultimodalForCausalLM(config).double().eval()
    norm = model.model.embed_tokens_extend.audio_embed.encoder.encoder_embedding
    with torch.no_grad():
        norm.global_mean.normal_()
        norm.global_invstd.uniform_(0.5, 2.0)
    return model


def _logits(model, **inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits[0]


def test_its_audio_encoder_reads_the_padding_of_the_longest_clip_beside_a_clip(tiny):
    from transformers import Phi4MultimodalFeatureExtractor

    extractor = Phi4MultimodalFeatureExtractor()
    encoder = tiny.model.embed_tokens_extend.audio_embed.encoder

    def encoded(waves: list[np.ndarray]) -> tuple[torch.Tensor, list[int]]:
        out = extractor(waves, sampling_rate=16_000, return_tensors="pt")
        with torch.no_grad():
            hidden = encoder(out["audio_input_features"].double(), out.get("audio_attention_mask"))
        return hidden, out["audio_embed_sizes"].tolist()

    short, longer, same = _wave(2, 0), _wave(5, 1), _wave(2, 2)
    alone, (n,) = encoded([short])
    beside_longer, sizes = encoded([short, longer])
    beside_same, _ = encoded([short, same])
    assert sizes[0] == n == 25 and sizes[1] > n  # its tokens do not move; its values do
    padded = float((alone[0, :n] - beside_longer[0, :n]).abs().max())
    control = float((alone[0, :n] - beside_same[0, :n]).abs().max())
    assert padded > 1e-2, f"a clip beside a longer one is encoded as alone ({padded:.2e})"
    assert control <= 1e-12, f"a clip beside one of its length differs ({control:.2e})"


def test_its_audio_projection_switches_on_any_image_of_the_call(tiny):
    from transformers import Phi4MultimodalFeatureExtractor

    out = Phi4MultimodalFeatureExtractor()([_wave(1, 3)], sampling_rate=16_000, return_tensors="pt")
    n = int(out["audio_embed_sizes"][0])
    ids = torch.cat(
        [torch.tensor([[5, 6]]), torch.full((1, n), AUDIO_TOKEN), torch.tensor([[7]])], 1
    )
    heard = dict(
        input_ids=ids,
        audio_input_features=out["audio_input_features"].double(),
        audio_embed_sizes=out["audio_embed_sizes"],
    )
    # another conversation's image in the same call: its pixels, none of this row's tokens
    pixels = dict(
        image_pixel_values=torch.zeros(1, 2, 3, 28, 28, dtype=torch.float64),
        image_sizes=torch.tensor([[28, 28]]),
        image_attention_mask=torch.ones(1, 2, 2, 2),
    )
    alone = _logits(tiny, **heard)
    assert torch.equal(alone, _logits(tiny, **heard))
    switched = float((alone - _logits(tiny, **heard, **pixels)).abs().max())
    assert switched > 1e-4, f"another conversation's pixels change nothing ({switched:.2e})"


def test_its_longrope_follows_the_longest_conversation_of_a_pack(tiny):
    generator = torch.Generator().manual_seed(4)
    a, long, short = (torch.randint(3, 50, (1, n), generator=generator) for n in (10, 30, 6))

    def beside(other: torch.Tensor) -> torch.Tensor:
        ids = torch.cat([a, other], 1)
        positions = torch.cat([torch.arange(a.shape[1]), torch.arange(other.shape[1])])[None]
        return _logits(tiny, input_ids=ids, position_ids=positions)[: a.shape[1]]

    alone = _logits(tiny, input_ids=a)
    crossed = float((alone - beside(long)).abs().max())
    within = float((alone - beside(short)).abs().max())
    assert crossed > 1e-5, f"a pack past {ORIGINAL} positions leaves a short one alone"
    assert within <= 1e-6, f"a pack within {ORIGINAL} positions differs ({within:.2e})"


def test_a_refused_models_directory_is_refused_before_its_processor_is_built(tmp_path, monkeypatch):
    """A directory whose config.json names a refused model type: its refusal line, not the
    error of building a processor that needs more than is installed (the bare Pixtral
    encoder's PixtralProcessor needs torchvision)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "pixtral"}))
    (tmp_path / "processor_config.json").write_text(
        json.dumps({"processor_class": "PixtralProcessor"})
    )
    with pytest.raises(ValueError) as raised:
        load_processor(tmp_path)
    assert str(raised.value) == f"{tmp_path}: {refusal('PixtralProcessor', 'pixtral')}"
    assert REFUSED["pixtral"] in str(raised.value)
    with pytest.raises(ValueError, match="not a model family energon_packing packs"):
        PackingTaskEncoder(max_input_seq_length=256, processor=str(tmp_path))
    from energon_packing.encoding import processor_loading

    monkeypatch.setattr(processor_loading, "_refuse_refused_model", lambda *a: None)
    with pytest.raises(ValueError) as other:  # the mutant: fails otherwise
        load_processor(tmp_path)
    assert REFUSED["pixtral"] not in str(other.value)
