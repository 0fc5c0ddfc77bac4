"""core-runner's Mamba2 plugin (plugins/mamba: attention-free, recurrent state per row, no
paged KV cache) against transformers.Mamba2ForCausalLM (CPU, float32, tiny random configs
with every tensor moved off its init value, as the conformance suite does).

Two checkpoints: an untied head with one B/C group, and a tied head with biases, no conv
bias, a dt clamp on both sides and (where the installed reference normalises the gated
RMSNorm per group: transformers >= 5.24, not 5.17) two groups. The scan chunk is 8 tokens,
so prompts of 7, 13 and 30 tokens and 5-token step budgets put chunk ends inside scan
chunks. References are full forwards of one prompt (no cache: transformers' own decode
path does not apply time_step_limit), greedy tokens their argmax, teacher-forced."""
from __future__ import annotations

import inspect

import pytest
import torch
from helpers import Checkpoint, Recorder, assert_logits_match_hf, hf_logits, random_prompts, run

from core_runner.conformance.reference import randomize_every_tensor

pytest.importorskip("core_runner_mamba", reason="pip install -e plugins/mamba (requirements-dev)")

VOCAB = 256
LOGIT_ATOL = 1e-4


def _reference_norm_is_grouped() -> bool:
    from transformers.models.mamba2 import modeling_mamba2 as m

    cls = getattr(m, "Mamba2RMSNormGated", None) or m.MambaRMSNormGated
    return "group_size" in inspect.signature(cls.__init__).parameters


BASE = dict(vocab_size=VOCAB, hidden_size=32, num_heads=8, head_dim=8, expand=2, state_size=16, conv_kernel=4,
            chunk_size=8, num_hidden_layers=2, layer_norm_epsilon=1e-5, initializer_range=0.15,
            eos_token_id=None, bos_token_id=None, pad_token_id=None)
SPECS = {
    "untied": dict(n_groups=1, tie_word_embeddings=False),
    "tied_bias_groups": dict(n_groups=2 if _reference_norm_is_grouped() else 1, tie_word_embeddings=True,
                             use_bias=True, use_conv_bias=False, time_step_limit=(0.005, 0.05)),
}


def _build(root, name: str) -> Checkpoint:
    import transformers

    torch.manual_seed(0)
    hf = transformers.Mamba2ForCausalLM(transformers.Mamba2Config(**BASE, **SPECS[name])).float().eval()
    randomize_every_tensor(hf, torch.Generator().manual_seed(1))
    path = root / name
    hf.save_pretrained(str(path))
    return Checkpoint(name=name, path=str(path), hf=hf, vocab=VOCAB)


@pytest.fixture(scope="module")
def mamba(tmp_path_factory, single_torch_thread):
    root = tmp_path_factory.mktemp("mamba2_tiny")
    return {name: _build(root, name) for name in SPECS}


def _engine(path: str, **kw):
    from core_runner import LLM

    return LLM(path, **{**dict(dtype="float32", device="cpu", max_model_len=64, max_num_seqs=8), **kw}).engine


def _greedy_from_logits(ckpt: Checkpoint, prompt: list[int], tokens: list[int]) -> None:
    ref = hf_logits(ckpt, prompt + tokens[:-1])
    for k, tok in enumerate(tokens):
        row = ref[len(prompt) - 1 + k]
        want = int(row.argmax())
        assert tok == want or float(row[want] - row[tok]) < 2e-4, f"token {k}: {tok}, reference {want}"


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("budget", [None, 5])
def test_logits_match_hf_chunked_prefill_and_decode(mamba, name, budget):
    ckpt = mamba[name]
    lengths = [1, 7, 8, 13, 30]
    prompts = random_prompts(lengths, seed=5, vocab=VOCAB)
    engine = _engine(ckpt.path, **({} if budget is None else {"max_num_batched_tokens": budget}))
    assert engine.num_blocks == 0  # attention-free: no KV pool at all
    rec = Recorder(engine)
    from core_runner import SamplingParams

    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = run(engine, [(f"r{i}", p, params) for i, p in enumerate(prompts)])
    for i, p in enumerate(prompts):
        _greedy_from_logits(ckpt, p, list(outs[f"r{i}"].token_ids))
    if budget is not None:
        assert max(s.num_tokens for s in rec.steps) <= budget
        assert any(0 < s.num_computed.get("r4", 0) < 30 for s in rec.steps), "the 30-token prompt was not chunked"
    assert assert_logits_match_hf(ckpt, rec, outs, atol=LOGIT_ATOL) >= len(prompts) * 6


def test_continuations_are_informative(mamba):
    """The references are worth comparing against: greedy continuations vary."""
    for ckpt in mamba.values():
        outs = run(_engine(ckpt.path), [(f"q{i}", p, _greedy(12)) for i, p in
                                        enumerate(random_prompts([9, 14, 21], seed=3, vocab=VOCAB))])
        assert sum(len(set(o.token_ids)) >= 4 for o in outs.values()) >= 2, ckpt.name


def _greedy(n: int):
    from core_runner import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def test_mamba_ssm_embedding_name_loads(mamba, tmp_path):
    """mamba_ssm checkpoints call the embedding ``backbone.embedding`` (transformers renames it
    on load, and so does the plugin)."""
    import shutil

    from safetensors.torch import load_file, save_file

    ckpt = mamba["untied"]
    dst = tmp_path / "renamed"
    shutil.copytree(ckpt.path, dst)
    f = next(dst.glob("*.safetensors"))
    tensors = load_file(str(f))
    tensors["backbone.embedding.weight"] = tensors.pop("backbone.embeddings.weight")
    save_file(tensors, str(f), metadata={"format": "pt"})
    p = random_prompts([11], seed=7, vocab=VOCAB)[0]
    a = run(_engine(ckpt.path), [("a", p, _greedy(4))])["a"].token_ids
    assert run(_engine(str(dst)), [("a", p, _greedy(4))])["a"].token_ids == a


def test_unimplemented_activation_is_refused_by_name(mamba, tmp_path):
    import json
    import shutil

    from core_runner.oracle import UnsupportedError

    dst = tmp_path / "gelu"
    shutil.copytree(mamba["untied"].path, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu"}))
    with pytest.raises(UnsupportedError, match="hidden_act='gelu'"):
        _engine(str(dst))


def test_residual_stream_stays_float32():
    """residual_in_fp32 (transformers' Mamba2Block): a bf16 block adds its mixer output to a
    float32 residual; without it the stream keeps the model dtype."""
    import transformers
    from core_runner_mamba.model import Mamba2Block

    from core_runner.forward_context import set_forward_context

    for flag, want in ((True, torch.float32), (False, torch.bfloat16)):
        cfg = transformers.Mamba2Config(**{**BASE, "residual_in_fp32": flag, "n_groups": 1})
        block = Mamba2Block(cfg).to(torch.bfloat16)
        block.mixer.kv_cache = block.mixer.kv_cache_spec("m", torch.bfloat16).allocate(2, "cpu")

        class Md:
            extra = {"mamba": {"state_rows_cpu": torch.tensor([0]), "has_initial_state_cpu": torch.tensor([False]),
                               "query_start_loc_cpu": torch.tensor([0, 3]), "write_state": False}}

        with torch.inference_mode(), set_forward_context(Md(), None, "torch"):
            out = block(torch.randn(3, BASE["hidden_size"], dtype=torch.bfloat16))
        assert out.dtype == want
