"""The kernel mode and the attention backend are independent (issue 21): under the
interpreter, kernels='torch' with the Triton attention backend runs the torch layers and
Triton attention, and kernels='triton' with the torch backend the reverse; both give the
all-torch engine's greedy tokens."""
from __future__ import annotations

import pytest
import torch

from core_runner import LLM, SamplingParams


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import transformers

    path = tmp_path_factory.mktemp("kernel_modes")
    cfg = transformers.Qwen3Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, initializer_range=0.15,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).eval().save_pretrained(path)
    return str(path)


def _generate(path: str, **kw) -> tuple[LLM, list[list[int]]]:
    llm = LLM(path, device="cpu", dtype="float32", max_model_len=16, max_num_seqs=2, block_size=4, num_kv_blocks=8,
              **kw)
    prompts = [[5, 9, 17], [3, 44, 8, 90, 21, 7, 60]]
    outs = llm.generate(prompts, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    return llm, [o.token_ids for o in outs]


@pytest.mark.parametrize("kernels,backend", [("torch", "triton"), ("triton", "torch")])
def test_kernel_mode_and_backend_are_independent(ckpt, device, monkeypatch, kernels, backend):
    if device != "cpu":
        pytest.skip("the interpreter wiring; the GPU runs the same plan code")
    import core_runner.attention.triton_backend as tb
    import core_runner.kernels.rms_norm_triton as rn
    from core_runner.attention.torch_backend import TorchPagedAttention

    _, want = _generate(ckpt, kernels="torch", attention_backend="torch")
    calls = {"triton_attention": 0, "torch_attention": 0, "triton_norm": 0}

    def counted(key, fn):
        def wrapper(*a, **kw):
            calls[key] += 1
            return fn(*a, **kw)
        return wrapper

    monkeypatch.setattr(tb, "paged_attention_triton", counted("triton_attention", tb.paged_attention_triton))
    monkeypatch.setattr(TorchPagedAttention, "forward", counted("torch_attention", TorchPagedAttention.forward))
    monkeypatch.setattr(rn, "rms_norm_triton", counted("triton_norm", rn.rms_norm_triton))
    llm, got = _generate(ckpt, kernels=kernels, attention_backend=backend)
    plan = llm.engine.plan
    assert (plan.kernels, plan.attention_backend, plan.cuda_graphs) == (kernels, backend, False)
    assert llm.engine.runner.triton == (kernels == "triton") and llm.engine.runner.backend.name == backend
    assert (calls["triton_attention"] > 0) == (backend == "triton")
    assert (calls["torch_attention"] > 0) == (backend == "torch")
    assert (calls["triton_norm"] > 0) == (kernels == "triton")
    assert got == want
