"""Mistral, Gemma 2 and Gemma 3 against transformers on prompts several windows long:
window 8, a 100-token prompt beside shorter ones, prefilled in 16-token chunks (chunk
ends fall inside and across windows), then decoded; every recorded logits row equals the
reference's full forward (1e-4, float32) and every token is its greedy choice. The
reference with the window removed differs, so the window is what is being checked.
The Triton path (interpreter on the CPU) runs the same comparison in
tests/kernels/test_families_windowed_triton.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import Checkpoint, Recorder, assert_logits_match_hf, greedy, hf_logits, make_engine, random_prompts, run

for _plugin in ("core_runner_mistral", "core_runner_gemma"):
    pytest.importorskip(_plugin, reason="pip install -e plugins/mistral -e plugins/gemma (requirements-dev)")

WINDOW = 8
VOCAB = 256
LENGTHS = [100, 37, 9]
NEW = 6
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.15,
              eos_token_id=None, bos_token_id=None, pad_token_id=None)
SLIDING, FULL = "sliding_attention", "full_attention"
# (config class, model class, fields): every family with its window features switched on
FAMILIES = {
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_hidden_layers=2, sliding_window=WINDOW)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        num_hidden_layers=3, layer_types=[SLIDING, FULL, SLIDING], sliding_window=WINDOW, query_pre_attn_scalar=24,
        attn_logit_softcapping=4.0, final_logit_softcapping=8.0, attn_implementation="eager")),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        num_hidden_layers=3, layer_types=[SLIDING, SLIDING, FULL], sliding_window=WINDOW, query_pre_attn_scalar=16,
        final_logit_softcapping=8.0, rope_parameters={FULL: {"rope_type": "default", "rope_theta": 1000000.0},
                                                      SLIDING: {"rope_type": "default", "rope_theta": 10000.0}})),
}


def build(root: Path, family: str, seed: int = 0, **changes: Any) -> Checkpoint:
    """The family's transformers model with every tensor moved off its init (the suite's
    rule), saved where the engine loads it; ``changes`` alter the config, not the weights."""
    import transformers

    from core_runner.conformance.reference import randomize_every_tensor

    cfg_name, cls_name, fields = FAMILIES[family]
    cfg = getattr(transformers, cfg_name)(**{**COMMON, **fields, **changes})
    torch.manual_seed(seed)
    hf = getattr(transformers, cls_name)(cfg).to(torch.float32).eval()
    randomize_every_tensor(hf, torch.Generator().manual_seed(seed + 1))
    path = root / f"{family}{'-' + '-'.join(changes) if changes else ''}"
    hf.save_pretrained(str(path))
    return Checkpoint(name=family, path=str(path), hf=hf, vocab=VOCAB)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def ckpt(request, tmp_path_factory) -> Checkpoint:
    return build(tmp_path_factory.mktemp("windowed"), request.param)


def check_windowed(ckpt: Checkpoint, lengths: list[int], new: int, **engine: Any) -> tuple[int, Any]:
    """Runs the prompts through chunked prefill + decode; returns the logits rows compared
    and the engine's execution plan."""
    e = make_engine(ckpt, max_model_len=128, max_num_seqs=4, max_num_batched_tokens=16, **engine)
    prompts = random_prompts(lengths, seed=5, vocab=VOCAB)
    rec = Recorder(e)
    outs = run(e, [(f"r{i}", p, greedy(new)) for i, p in enumerate(prompts)])
    rows = assert_logits_match_hf(ckpt, rec, outs)
    for out in outs.values():
        seq = list(out.prompt_token_ids) + list(out.token_ids)
        ref = hf_logits(ckpt, seq[:-1])
        n = len(out.prompt_token_ids)
        assert len(out.token_ids) == new and out.finish_reason == "length"
        for k, tok in enumerate(out.token_ids):
            row = ref[n - 1 + k]
            assert float(row[int(row.argmax())] - row[tok]) <= 2e-4, f"{ckpt.name}: token {k} is not greedy"
    # chunk ends at positions 15, 31, ... of the long prompt were compared, past several windows
    assert rows >= len(lengths) * new + max(lengths) // 16
    return rows, e.plan


def test_windowed_families_match_transformers(ckpt):
    _, plan = check_windowed(ckpt, LENGTHS, NEW, kernels="torch")
    assert plan.kernels == "torch" and plan.attention_backend == "torch"


def test_the_window_changes_the_reference(ckpt, tmp_path):
    """Without the window the reference's logits move far past the tolerance at the end of
    the long prompt: a model that ignored the window could not pass the test above."""
    full = build(tmp_path, ckpt.name, sliding_window=4096)
    seq = random_prompts([LENGTHS[0]], seed=5, vocab=VOCAB)[0]
    assert float((hf_logits(full, seq)[-1] - hf_logits(ckpt, seq)[-1]).abs().max()) > 1e-2
