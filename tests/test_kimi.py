"""Kimi-K2.5 (``Kimi_K25Processor``, since transformers 5.13), whose image processor exists
only with torchvision (issue 33 items 3 and 5).

Its loader proof is the families' own, on the ``torchvision`` stack (.ci/stacks.txt):
``tests/test_families.py::test_a_family_through_its_processor_and_the_loader[kimi_k25]``
(the real processor and a tiny random-init ``Kimi_K25ForConditionalGeneration``,
:mod:`energon_packing.testing.families_kimi`: ids, ``pixel_values`` and ``image_grid_thw``
equal the processor's on each conversation alone, per-source logits equal alone). Here: the
size rule (:func:`energon_packing.encoding.kimi_grid.kimi_grid`, plain Python) equals the image
processor's ``navit_resize`` on fuzzed sizes and settings (torchvision), and a Kimi-K2.5
directory without torchvision is refused in one line (everywhere).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")


@pytest.mark.torchvision
def test_the_size_rule_is_the_image_processors():
    """``kimi_grid`` equals the image processor's own ``navit_resize`` (then its padding to
    whole merges) over fuzzed sizes, patch budgets and side bounds."""
    from transformers.models.kimi_k25 import image_processing_kimi_k25 as upstream

    from energon_packing.encoding.kimi_grid import kimi_grid

    rng = np.random.default_rng(0)
    sizes = [tuple(int(x) for x in rng.integers(1, 6000, 2)) for _ in range(400)]
    sizes += [(1, 1), (13, 15), (14, 14), (28, 28), (29, 1), (10, 9000), (7168, 7169)]
    for patch, merge, max_patches, max_side in (
        (14, 2, 16384, 512),
        (14, 2, 256, 24),
        (16, 2, 1000, 40),
        (4, 2, 64, 7),
    ):
        for h, w in sizes:
            _, (ph, pw) = upstream.navit_resize(
                h,
                w,
                patch_size=patch,
                merge_kernel_size=merge,
                max_patches=max_patches,
                max_size_per_side=max_side,
            )
            got = kimi_grid(
                h, w, patch=patch, merge=merge, max_patches=max_patches, max_side=max_side
            )
            assert got == (ph // patch, pw // patch), (h, w, patch, max_patches, max_side)


@pytest.mark.parametrize("named", ["Kimi_K25Processor", "KimiK25Processor"])
def test_a_kimi_directory_without_torchvision_is_refused_in_one_line(tmp_path, monkeypatch, named):
    """Where torchvision does not import (made so), a Kimi-K2.5 directory names torchvision and
    the family in one line, whether its processor config names transformers' class or the
    hub's remote-code one (then its config.json's model type decides)."""
    import json

    from energon_packing import load_processor
    from energon_packing.encoding import processor_loading

    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": named}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_k25"}))
    monkeypatch.setattr(processor_loading, "_torchvision_available", lambda: False)
    with pytest.raises(ValueError) as raised:
        load_processor(tmp_path)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path}: {named} (the kimi_k25 family) needs torchvision")
