"""tests/test_families_windowed.py on the Triton path (interpreter on the CPU, compiled on
a GPU): the paged attention kernel's window and soft cap, with the Triton norm, rotary,
SiLU and KV-write kernels, give transformers' logits for Mistral, Gemma 2 and Gemma 3
over a prompt several windows long under chunked prefill and decode."""
from __future__ import annotations

import pytest
from test_families_windowed import FAMILIES, build, check_windowed


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_windowed_families_triton_path(family, device, tmp_path):
    ckpt = build(tmp_path, family)
    _, plan = check_windowed(ckpt, [100, 9], 3, kernels="triton" if device == "cpu" else None, device=device)
    assert plan.kernels == "triton" and plan.attention_backend == "triton"
