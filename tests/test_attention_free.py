"""Models with zero paged KV caches (attention-free: every cache is per-row state, a
``RowStateSpec``), one test for each place of the engine that used to assume at least one
attention layer: the KV cache layout (kv_cache_groups.py), the scheduler's block
bookkeeping (kv_manager.py, block_pool.py, scheduler.py), the runner's block tables
(request_state.py, model_runner.py's per-group inputs and the CUDA-graph capture inputs),
memory sizing (LLMEngine: num_kv_blocks, the pool sized from memory, memory_report,
blocks_per_request), the server's KV-usage gauge (async_llm.py) and the model states
(mamba_hybrid.py serves it; default.py refuses a model without any cache spec).

The engine-level tests use a tiny transformers Mamba2ForCausalLM served by the mamba
plugin (plugins/mamba)."""
from __future__ import annotations

import pytest
import torch

from core_runner.engine.block_pool import BlockPool
from core_runner.engine.kv_manager import KVCacheManager
from core_runner.engine.request import Request
from core_runner.engine.scheduler import Scheduler
from core_runner.kv_cache_groups import plan_kv_cache_layout
from core_runner.kv_cache_spec import PagedCacheSpec, RowStateSpec
from core_runner.runner.request_state import RequestState
from core_runner.sampling_params import SamplingParams
from core_runner.step_data.scheduler_output import NewRequest

ROW_SPEC = RowStateSpec("backbone.layers.0.mixer", shapes=((3, 8), (2, 4, 4)), dtypes=(torch.float32, torch.float32))


# ---------------------------------------------------------------------------------
# layout, pool, block bookkeeping, scheduler, row tables (no engine)
# ---------------------------------------------------------------------------------
def test_layout_of_row_state_only_has_no_group():
    for specs in ([], [ROW_SPEC]):
        layout = plan_kv_cache_layout(specs)
        assert layout.num_groups == 0 and layout.groups == () and layout.group_of() == {}
        assert layout.pool_bytes_per_token(specs) == 0
        assert layout.allocate(specs, 0, 16, "cpu") == {}
    # one paged layer beside row state still gives the one full group it always did
    paged = PagedCacheSpec("model.layers.1.attn", 2, 8, torch.float32)
    assert plan_kv_cache_layout([ROW_SPEC, paged]).num_groups == 1


def test_block_pool_of_zero_blocks():
    pool = BlockPool(0)
    assert pool.num_free == 0 and pool.allocate(0) == []
    with pytest.raises(RuntimeError, match="only 0 free"):
        pool.allocate(1)
    with pytest.raises(ValueError, match="num_blocks=-1"):
        BlockPool(-1)


def test_kv_manager_without_groups_never_needs_a_block():
    kv = KVCacheManager([], num_blocks=0, block_size=4)
    assert kv.num_groups == 0
    table = kv.new_table()
    assert table == [] and kv.held(table) == []
    assert kv.grow(table, 0, 1000) == []  # not None: nothing to allocate, nothing refused
    kv.release_out_of_window(table, 500)
    kv.cache(table, [], 0, 0)
    assert kv.take_cached([], 10, drop_last=False) == ([], 0)
    kv.free(table)


def _request(rid: str, n: int, max_tokens: int = 3) -> Request:
    return Request(rid, list(range(3, 3 + n)), SamplingParams(max_tokens=max_tokens, temperature=0.0), seed=0)


def test_scheduler_without_groups_schedules_chunks_and_preempts_by_force():
    # prefix caching on: with no group nothing is ever cached, so nothing may be found either
    s = Scheduler(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64, block_size=4, num_blocks=0,
                  kv_cache_windows=[], enable_prefix_caching=True)
    for i, n in enumerate((20, 5, 3)):
        s.add_request(_request(f"r{i}", n))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"r0": 8}  # chunked prefill: the budget, not a pool, limits
    assert out.new_block_ids == {} and [r.block_ids for r in out.new_reqs] == [[]]
    assert [r.num_computed_tokens for r in out.new_reqs] == [0] and s.prefix_cache_hits == 0
    out = s.schedule()
    assert out.num_scheduled_tokens == {"r0": 8} and not out.preempted_req_ids
    s.force_preempt("r0")  # preemption by recompute frees nothing, and r0 starts again at its first token
    out = s.schedule()
    assert out.preempted_req_ids == {"r0"} and out.num_scheduled_tokens == {"r0": 8}
    assert [(r.req_id, r.num_computed_tokens, r.block_ids) for r in out.new_reqs] == [("r0", 0, [])]
    assert s.num_preemptions == 1 and s.pool.num_free == 0
    # the default (no windows given) is still one full-attention group
    assert Scheduler(max_num_seqs=1, max_num_batched_tokens=8, max_model_len=8, block_size=4,
                     num_blocks=2).kv.num_groups == 1


def test_request_state_without_groups_keeps_an_unused_block_table():
    rs = RequestState(max_num_reqs=2, max_model_len=16, max_blocks_per_req=4, device=torch.device("cpu"))
    rs.set_num_kv_groups(0)
    assert rs.group_tables == [] and rs.num_blocks_cpu == []
    row = rs.add(NewRequest(req_id="a", token_ids=[5, 6, 7], num_prompt_tokens=3,
                            sampling_params=SamplingParams(), seed=0, block_ids=[]))
    rs.append_blocks(row, [])
    rs.apply_staged_writes()
    tables = rs.tables()
    assert tables["block_table"].shape == (3, 4) and not tables["block_table"].any()
    assert not any(k.startswith("block_table.") for k in tables)
    assert rs.remove("a") == row


# ---------------------------------------------------------------------------------
# the engine: runner, memory sizing, model states, graph-capture inputs, server gauge
# ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mamba_path(tmp_path_factory, single_torch_thread):
    pytest.importorskip("core_runner_mamba", reason="pip install -e plugins/mamba (requirements-dev)")
    import transformers

    cfg = transformers.Mamba2Config(vocab_size=128, hidden_size=16, num_heads=4, head_dim=8, expand=2, state_size=8,
                                    n_groups=1, conv_kernel=4, chunk_size=4, num_hidden_layers=2,
                                    eos_token_id=None, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("mamba_free") / "ckpt"
    transformers.Mamba2ForCausalLM(cfg).float().eval().save_pretrained(str(path))
    return str(path)


def _llm(path: str, **kw):
    from core_runner import LLM

    opts = dict(dtype="float32", device="cpu", max_model_len=64, max_num_seqs=4, block_size=4)
    return LLM(path, **{**opts, **kw})


def test_engine_has_no_kv_pool(mamba_path):
    e = _llm(mamba_path).engine
    rep = e.memory_report()
    assert rep["kv_cache_groups"] == 0 and rep["kv_bytes_per_token"] == 0 and rep["kv_pool_bytes_per_token"] == 0
    assert rep["state_bytes_per_row"] > 0 and rep["num_blocks"] == 0
    assert e.num_blocks == 0 and e.blocks_per_request() == 0
    assert e.debug.paged_caches() == {} and e.debug.kv_cache_groups() == [] and e.debug.num_free_blocks == 0
    # row state for every row (max_num_seqs + the scratch row), nothing paged
    assert all(t.shape[0] == 5 for name, t in e.debug.row_tables().items() if name.startswith("row_cache."))


def test_num_kv_blocks_is_refused(mamba_path):
    with pytest.raises(ValueError, match="num_kv_blocks=8: Mamba2ForCausalLM has no paged KV cache"):
        _llm(mamba_path, num_kv_blocks=8)


def test_memory_sizing_fits_the_row_state_not_blocks(mamba_path):
    row = _llm(mamba_path).engine.memory_report()["state_bytes_per_row"] * 5
    # plenty of memory: still no pool (zero bytes per block must not buy billions of blocks)
    assert _llm(mamba_path, memory_probe=lambda d: 1 << 40).engine.num_blocks == 0
    with pytest.raises(ValueError, match="kv_cache_memory_fraction"):  # the state alone does not fit
        _llm(mamba_path, memory_probe=lambda d: row, kv_cache_memory_fraction=0.5)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        _llm(mamba_path, memory_probe=lambda d: (row, row), gpu_memory_utilization=0.5)
    roomy = _llm(mamba_path, memory_probe=lambda d: (4 * row, 4 * row), gpu_memory_utilization=0.5)
    assert roomy.engine.num_blocks == 0


def test_generation_chunked_preempted_and_async_without_blocks(mamba_path):
    from core_runner import SamplingParams as SP

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (17, 3, 9)]
    params = SP(max_tokens=6, temperature=0.0, ignore_eos=True)

    def tokens(**kw) -> list[list[int]]:
        outs = _llm(mamba_path, **kw).generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    want = tokens()
    assert tokens(max_num_batched_tokens=5) == want
    assert tokens(max_num_batched_tokens=5, async_scheduling=True) == want
    e = _llm(mamba_path, max_num_batched_tokens=5).engine
    for i, p in enumerate(prompts):
        e.add_request(p, params, req_id=f"p{i}")
    outs: dict = {}
    steps = 0
    while e.has_unfinished_requests():
        for o in e.step():
            outs[o.request_id] = o
        steps += 1
        if steps == 6 and "p0" in e.debug.preemptible():
            e.debug.preempt("p0")
    assert [list(outs[f"p{i}"].outputs[0].token_ids) for i in range(3)] == want
    assert e.debug.num_preemptions == 1


def test_model_states(mamba_path):
    from model_states.default import DefaultModelState
    from model_states.mamba_hybrid import MambaHybridModelState

    e = _llm(mamba_path).engine
    assert type(e.model_state) is MambaHybridModelState
    assert not issubclass(MambaHybridModelState, DefaultModelState)  # does not inherit its refusal
    specs = e.model_state.kv_cache_specs()
    assert specs and all(isinstance(s, RowStateSpec) for s in specs)
    cfg = e.config
    # the attention-only state refuses a model with no cache spec at all, by name
    with pytest.raises(ValueError, match="has no layer with a kv_cache_spec"):
        DefaultModelState(cfg, torch.nn.Linear(2, 2), torch.device("cpu")).kv_cache_specs()
    with pytest.raises(ValueError, match="no layer with recurrent row state"):
        MambaHybridModelState(cfg, torch.nn.Linear(2, 2), torch.device("cpu")).kv_cache_specs()


def test_dummy_runs_and_graph_capture_inputs(mamba_path):
    """The inputs CUDA-graph capture builds (a padded dummy batch, ``prepare_attn(for_capture=True)``)
    need no block table of any group; run eagerly here, the graph itself needs CUDA."""
    from core_runner.forward_context import set_forward_context
    from core_runner.runner.cuda_graphs import GraphKey

    e = _llm(mamba_path, max_num_batched_tokens=16).engine
    for nr, nt in ((1, 1), (3, 7), (4, 16)):
        e.dummy_run(nr, nt)
    runner = e.runner
    for key in (GraphKey(True, 4, 4), GraphKey(False, 4, 16)):
        batch = runner._dummy_batch(key.num_reqs, key.num_tokens, key=key)
        assert batch.group_block_tables == () and batch.group_slot_mappings == ()
        attn = runner.model_state.prepare_attn(batch, for_capture=True)
        assert attn.kv_groups == ()
        with torch.inference_mode(), set_forward_context(attn, runner.backend, "torch"):
            hidden = runner.model(batch.input_ids, batch.positions)
        assert hidden.shape[0] == key.num_tokens and torch.isfinite(hidden).all()


def test_server_kv_usage_gauge_is_zero(mamba_path):
    from core_runner.engine.async_llm import AsyncLLM

    class Stats:
        def __init__(self) -> None:
            self.usage: list[float] = []

        def on_step(self, num_running: int, num_waiting: int, kv_cache_usage: float) -> None:
            self.usage.append(kv_cache_usage)

        def __getattr__(self, name: str):
            return lambda *a, **k: None

    stats = Stats()
    a = AsyncLLM(_llm(mamba_path).engine, stats=stats)
    try:
        a._report_step()
    finally:
        a.close()
    assert stats.usage == [0.0]  # no pool is not a full pool
