"""The default max_num_seqs of a hybrid model is fitted to its per-row state
(``engine/defaults.fit_max_num_seqs``): on an H100 the engine's default 1,024 rows of
granite-4.0-h-350m's Mamba state, with their prefix-cache snapshots, left the attention
layers' KV pool no block (the profile's caches were also counted twice, fixed since). A
max_num_seqs the user gave is kept, and one whose state leaves no room for a request is
refused naming max_num_seqs."""
from __future__ import annotations

import pytest
import torch

from core_runner.config import EngineConfig
from core_runner.engine.defaults import ROW_FIT_SHARE, fit_max_num_seqs


@pytest.fixture(scope="module")
def hybrid_path(tmp_path_factory, single_torch_thread):
    pytest.importorskip("core_runner_granite_hybrid", reason="pip install -e plugins/granite_hybrid")
    import transformers

    cfg = transformers.GraniteMoeHybridConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"],
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, shared_intermediate_size=64,
        mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=8, num_local_experts=0, num_experts_per_tok=0, position_embedding_type="nope",
        max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hybrid_fit") / "ckpt"
    transformers.GraniteMoeHybridForCausalLM(cfg).float().eval().save_pretrained(str(path))
    return str(path)


def _llm(path: str, **kw):
    from core_runner import LLM

    opts = dict(dtype="float32", device="cpu", max_model_len=64, block_size=4, kv_cache_memory_fraction=0.5)
    return LLM(path, **{**opts, **kw})


def test_footprint_reports_the_engines_row_state(hybrid_path):
    import transformers
    from core_runner_granite_hybrid.model import GraniteMoeHybridForCausalLM

    from core_runner.loader import estimate_footprint

    eng = _llm(hybrid_path, max_num_seqs=4).engine
    fp = estimate_footprint(GraniteMoeHybridForCausalLM, transformers.AutoConfig.from_pretrained(hybrid_path),
                            torch.float32)
    rep = eng.memory_report()
    assert fp.state_bytes_per_row == rep["state_bytes_per_row"] > 0
    assert fp.snapshot_bytes_per_row * rep["state_snapshot_slots"] == rep["state_snapshot_bytes"] > 0


def test_chosen_max_num_seqs_is_lowered_to_fit_the_row_state(hybrid_path):
    eng = _llm(hybrid_path, max_num_seqs=4).engine
    rep = eng.memory_report()
    per_row, snap_row = rep["state_bytes_per_row"], rep["state_snapshot_bytes"] // rep["state_snapshot_slots"]
    assert eng.config.max_num_seqs == 4  # given: never changed
    weights = sum(p.numel() * p.element_size() for p in eng.model.parameters())
    free = weights + 160 * per_row  # a cache budget (fraction 0.5) of 80 rows' state

    def need(n: int) -> int:  # rows + scratch row, a snapshot per row, 64 tokens of KV per row
        return per_row * (n + 1) + snap_row * n + n * 64 * rep["kv_bytes_per_token"]

    fitted = _llm(hybrid_path, memory_probe=lambda d: free).engine
    seqs = fitted.config.max_num_seqs
    assert EngineConfig(model=hybrid_path, device="cpu").max_num_seqs == 64  # the CPU default
    assert 1 < seqs < 64 and seqs & (seqs - 1) == 0  # halved from 64
    assert need(seqs) <= ROW_FIT_SHARE * 0.5 * (free - weights) < need(2 * seqs)
    assert fitted.memory_report()["state_snapshot_slots"] == seqs
    assert fitted.num_blocks >= fitted.blocks_per_request()
    outs = _llm(hybrid_path, memory_probe=lambda d: free).generate([[3, 4, 5]], use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) > 0


def test_given_max_num_seqs_whose_state_leaves_no_pool_is_refused_by_name(hybrid_path):
    eng = _llm(hybrid_path, max_num_seqs=4).engine
    rep = eng.memory_report()
    free = 2 * (rep["state_bytes_per_row"] * 65 + rep["state_snapshot_bytes"] // 4 * 64)  # all of it to the rows
    with pytest.raises(ValueError, match=r"max_num_seqs=64: the per-row state .* lower max_num_seqs"):
        _llm(hybrid_path, max_num_seqs=64, memory_probe=lambda d: free)


def test_fit_function_keeps_given_and_stateless_limits():
    cfg = EngineConfig(model="m", device="cpu", max_model_len=1024)
    assert cfg.max_num_seqs == 64
    mib = 1 << 20
    assert fit_max_num_seqs(cfg, 0, 0, 0, True, 0, mib << 10, mib << 10) == 64  # no row state
    assert fit_max_num_seqs(cfg, mib, mib, 0, True, 0, 1 << 40, 1 << 40) == 64  # plenty of memory
    # 1 MiB a row + 1 MiB a snapshot; 0.5 x 64 MiB free = 32 MiB of cache, 0.8 of it = 25.6 MiB for
    # n rows + 1 scratch + n snapshots: 8 rows take 17 MiB, 16 take 33
    assert fit_max_num_seqs(cfg, mib, mib, 0, True, 0, 64 * mib, 64 * mib) == 8
    assert fit_max_num_seqs(cfg, mib, mib, 0, False, 0, 64 * mib, 64 * mib) == 16  # no snapshots
    # and 1,024 tokens of 2 KiB KV per row: 2 MiB more a row, so 8 rows take 33 MiB, 4 take 17
    assert fit_max_num_seqs(cfg, mib, mib, 2048, True, 0, 64 * mib, 64 * mib) == 4
    assert fit_max_num_seqs(cfg, mib, mib, 0, True, 32 * mib, 96 * mib, 96 * mib) == 8  # weights come off first
    given = EngineConfig(model="m", device="cpu", max_num_seqs=64)
    assert fit_max_num_seqs(given, mib, mib, 0, True, 0, 64 * mib, 64 * mib) == 64


def test_released_caches_are_freed_and_a_bind_that_keeps_them_is_caught(hybrid_path):
    from core_runner.conformance.checks_state import rebind_caches

    want = _llm(hybrid_path, max_num_seqs=4).generate([[3, 4, 5, 6]], use_tqdm=False)[0].outputs[0].token_ids
    llm = _llm(hybrid_path, max_num_seqs=4)
    eng = llm.engine
    rebind_caches(eng)  # before any request, as the profile: the built-in state drops every released tensor
    assert llm.generate([[3, 4, 5, 6]], use_tqdm=False)[0].outputs[0].token_ids == want
    kept = []
    bind = eng.model_state.bind_kv_caches
    eng.model_state.bind_kv_caches = lambda caches: (kept.append(dict(caches)), bind(caches))
    eng.executor.initialize_kv_cache(eng.num_blocks)
    with pytest.raises(Exception, match="still referenced"):
        rebind_caches(eng)
