"""GraniteMoeHybrid under tensor (and expert) parallelism: TP=N must equal TP=1
(float32, CPU, gloo), through the engine's own path (``LLM(tensor_parallel_size=N)``:
rank 0 in the test process, workers started by the executor). Greedy tokens, the
scheduling and every recorded logits row are compared with a plain TP=1 engine; rank 0's
logits are the all-gather of every rank's part, so a wrong rank shows there.

Checkpoints: the plugin's tiny-dense-nope and tiny-moe-rope examples (n_groups=1: every
rank keeps the whole B and C, and the gated norm's one group spans the ranks) and
tiny-moe-rope with n_groups=2 (split groups at TP=2, with whole experts per rank; at
TP=4 each group spans two ranks and each rank holds one of the two KV heads, replicated).
The scenario chunks a prompt longer than max_num_batched_tokens (state carried over
chunks) and gives a late request the row of one that finished.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import greedy, random_prompts, run

from core_runner.distributed import GroupCoordinator, use_tp_group

ATOL = 1e-4
VOCAB = 256
# max_num_seqs=2: the third request waits for a row, then reuses the one freed first;
# max_num_batched_tokens=8: the 21-token prompt is prefilled in chunks (state carried)
ENGINE = dict(dtype="float32", device="cpu", max_model_len=64, max_num_seqs=2, block_size=4, num_kv_blocks=32,
              max_num_batched_tokens=8)
PROMPT_LENGTHS = {"long": 21, "short": 5, "late": 13}
N_NEW = 6


def _examples() -> dict[str, dict]:
    from core_runner.plugins import load_plugins

    reg = load_plugins().registry.get("GraniteMoeHybridForCausalLM")
    ex = {e["name"]: e["config"] for e in reg.examples}
    return {
        "dense_nope": ex["tiny-dense-nope"],
        "moe_rope": ex["tiny-moe-rope"],
        "moe_rope_groups2": {**ex["tiny-moe-rope"], "mamba_n_groups": 2},
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, single_torch_thread) -> dict[str, str]:
    import transformers

    root = tmp_path_factory.mktemp("granite_tp")
    paths = {}
    for seed, (name, cfg) in enumerate(_examples().items()):
        config = transformers.GraniteMoeHybridConfig(**cfg)
        torch.manual_seed(seed)
        transformers.GraniteMoeHybridForCausalLM(config).to(torch.float32).save_pretrained(str(root / name))
        paths[name] = str(root / name)
    return paths


def _scenario(path: str, rebind: bool = False, **options) -> dict:
    """Run the three requests; returns tokens, logits by position, rows, the steps'
    scheduling and the shapes of (rank 0's) Mamba state buffers. ``rebind``: first release
    the caches on every rank and bind new ones, as the GPU memory profile does."""
    from core_runner import LLM
    from core_runner.conformance.checks_state import rebind_caches
    from core_runner.conformance.harness import Recorder

    engine = LLM(path, **ENGINE, **options).engine
    try:
        if rebind:
            rebind_caches(engine)
        rec = Recorder(engine, strict=True)
        prompts = dict(zip(PROMPT_LENGTHS, random_prompts(list(PROMPT_LENGTHS.values()), seed=7, vocab=VOCAB)))
        outs = run(engine, [(name, p, greedy(N_NEW)) for name, p in prompts.items()])
        return {
            "tokens": {r: list(o.token_ids) for r, o in outs.items()},
            "logits": {r: dict(rec.logits_of(r)) for r in prompts},
            "rows": {r: rec.rows_of(r) for r in prompts},
            "steps": [(dict(s.num_computed), dict(s.num_scheduled), list(s.new_req_ids)) for s in rec.steps],
            "state_shapes": {k: tuple(t.shape) for k, t in engine.model_state.row_buffers().items()},
        }
    finally:
        engine.shutdown()


def _assert_scenario_exercised(ref: dict) -> None:
    """The TP=1 run really chunked the long prompt and gave the late request a reused row."""
    chunk_steps = [c["long"] for c, _, new in ref["steps"] if "long" in c and "long" not in new]
    assert any(0 < n < PROMPT_LENGTHS["long"] for n in chunk_steps), "the long prompt was not prefilled in chunks"
    late_start = next(i for i, (_, _, new) in enumerate(ref["steps"]) if "late" in new)
    assert all("late" not in s for _, s, _ in ref["steps"][:late_start]), "late request ran before a row was free"
    late_row = ref["rows"]["late"][0]
    assert late_row in (ref["rows"]["long"][0], ref["rows"]["short"][0]), f"late request got a fresh row {late_row}"


@pytest.fixture(scope="module")
def references(checkpoints) -> dict[str, dict]:
    refs = {name: _scenario(path) for name, path in checkpoints.items()}
    for ref in refs.values():
        _assert_scenario_exercised(ref)
    return refs


def _state_width(shapes: dict) -> dict:
    """conv channels / SSM heads of each Mamba layer's row state."""
    return {k: (s[2] if k.endswith("conv_state") else s[1]) for k, s in shapes.items()}


@pytest.mark.parametrize("name,options", [
    ("dense_nope", dict(tensor_parallel_size=2)),
    ("moe_rope", dict(tensor_parallel_size=2)),
    ("moe_rope_groups2", dict(tensor_parallel_size=2, enable_expert_parallel=True)),
    ("moe_rope_groups2", dict(tensor_parallel_size=4)),
], ids=["dense_nope-tp2", "moe_rope-tp2", "groups2-tp2-ep", "groups2-tp4"])
def test_tp_equals_tp1(checkpoints, references, name, options):
    ref, tp = references[name], options["tensor_parallel_size"]
    got = _scenario(checkpoints[name], **options)
    assert got["steps"] == ref["steps"], "scheduling differs"
    assert got["rows"] == ref["rows"], "state rows differ"
    assert got["tokens"] == ref["tokens"], "greedy tokens differ"
    worst = 0.0
    for req, by_pos in ref["logits"].items():
        assert got["logits"][req].keys() == by_pos.keys(), f"{req}: logits at other positions"
        for pos, want in by_pos.items():
            err = (got["logits"][req][pos] - want).abs().max().item()
            assert err <= ATOL, f"{req}: logits at position {pos} differ from TP=1 by {err:.3g}"
            worst = max(worst, err)
    print(f"granite {name} {options}: max |logit - TP=1| = {worst:.3g}")
    # a row's state is per rank: 1/tp of the heads; B and C whole (the rank's one group) or 1/tp of them
    cfg = _examples()[name]
    n_groups, bc = cfg["mamba_n_groups"], 2 * cfg["mamba_d_state"] * cfg["mamba_n_groups"]
    local_bc = bc // tp if n_groups % tp == 0 else bc // n_groups
    for key, full in _state_width(ref["state_shapes"]).items():
        local = _state_width(got["state_shapes"])[key]
        want = full // tp if key.endswith("ssm_state") else (full - bc) // tp + local_bc
        assert local == want, f"{key}: {local} channels/heads on rank 0, expected {want}"


def test_tp_caches_released_and_bound_again_on_every_rank(checkpoints, references):
    got = _scenario(checkpoints["moe_rope"], rebind=True, tensor_parallel_size=2)
    assert got["tokens"] == references["moe_rope"]["tokens"]  # the ranks' rebound rows and pools serve


# ---------------------------------------------------------------------------------
# which slices each rank loads (no processes: a rank's group installed by hand)
# ---------------------------------------------------------------------------------
def _as_rank(rank: int, world_size: int, expert_parallel: bool = False):
    return use_tp_group(GroupCoordinator(rank=rank, world_size=world_size, expert_parallel=expert_parallel))


H, P, N, K, HID = 8, 4, 3, 4, 16  # mamba heads, head dim, state size, conv width, hidden size


def _mixer(n_groups: int):
    from core_runner.layers import Mamba2Mixer

    return Mamba2Mixer(HID, num_heads=H, head_dim=P, d_state=N, n_groups=n_groups, d_conv=K, conv_bias=True,
                       proj_bias=True)


def _load(module, tensors: dict[str, torch.Tensor]) -> None:
    params = dict(module.named_parameters())
    assert params.keys() == tensors.keys()
    for name, t in tensors.items():
        params[name].weight_loader(params[name], t)


@pytest.mark.parametrize("n_groups,tp", [(1, 2), (2, 2), (4, 2), (2, 4), (1, 4)])
def test_mixer_rank_slices(n_groups, tp):
    """Each rank's in_proj rows, conv channels and per-head parameters are those of its
    heads and of the groups they read (head h reads group h // (H / n_groups))."""
    d_inner, gn = H * P, n_groups * N
    with _as_rank(0, 1):
        full = {k: torch.randn(v.shape) for k, v in _mixer(n_groups).named_parameters()}
    for rank in range(tp):
        heads = list(range(rank * H // tp, (rank + 1) * H // tp))
        groups = sorted({h // (H // n_groups) for h in heads})
        chans = [c for h in heads for c in range(h * P, (h + 1) * P)]
        bc = [g * N + i for g in groups for i in range(N)]
        in_rows = chans + [d_inner + c for c in chans] + [2 * d_inner + r for r in bc] + \
            [2 * d_inner + gn + r for r in bc] + [2 * d_inner + 2 * gn + h for h in heads]
        conv_rows = chans + [d_inner + r for r in bc] + [d_inner + gn + r for r in bc]
        with _as_rank(rank, tp):
            m = _mixer(n_groups)
        _load(m, full)
        want = {
            "in_proj.weight": full["in_proj.weight"][in_rows], "in_proj.bias": full["in_proj.bias"][in_rows],
            "conv1d.weight": full["conv1d.weight"][conv_rows], "conv1d.bias": full["conv1d.bias"][conv_rows],
            "A_log": full["A_log"][heads], "D": full["D"][heads], "dt_bias": full["dt_bias"][heads],
            "norm.weight": full["norm.weight"][chans], "out_proj.weight": full["out_proj.weight"][:, chans],
            "out_proj.bias": full["out_proj.bias"],
        }
        got = dict(m.named_parameters())
        for name, w in want.items():
            assert torch.equal(got[name], w), f"rank {rank}/{tp} n_groups={n_groups}: {name}"
        spec = m.kv_cache_spec("layer", torch.float32)
        assert spec.shapes == ((K - 1, len(chans) + 2 * len(bc)), (len(heads), P, N))
        assert m.norm.spans_ranks == (n_groups < tp)


def _moe(num_experts: int, intermediate: int):
    """The plugin's MoE block (router + FusedMoE), returning this rank's partial sum."""
    from types import SimpleNamespace

    from core_runner_granite_hybrid.common import GraniteMoE

    cfg = SimpleNamespace(num_local_experts=num_experts, hidden_size=HID, intermediate_size=intermediate,
                          num_experts_per_tok=2)
    return GraniteMoE(cfg, reduce_results=False)


def test_experts_and_shared_mlp_rank_slices():
    from core_runner_granite_hybrid.model import SharedMLP

    E, I, S = 3, 8, 12
    gate_up, down, router = torch.randn(E, 2 * I, HID), torch.randn(E, HID, I), torch.randn(E, HID)
    shared_in, shared_out = torch.randn(2 * S, HID), torch.randn(HID, S)
    for rank in range(2):
        with _as_rank(rank, 2):
            moe, mlp = _moe(E, I), SharedMLP(HID, S, "silu", reduce_results=False)
        _load(moe, {"router.weight": router, "experts.w13.weight": gate_up, "experts.w2.weight": down})
        _load(mlp, {"input_linear.weight": shared_in, "output_linear.weight": shared_out})
        mine, smine = slice(rank * I // 2, (rank + 1) * I // 2), slice(rank * S // 2, (rank + 1) * S // 2)
        assert torch.equal(moe.router.weight, router)  # replicated: every rank routes alike
        assert torch.equal(moe.experts.w13.weight, torch.cat([gate_up[:, :I][:, mine], gate_up[:, I:][:, mine]], 1))
        assert torch.equal(moe.experts.w2.weight, down[:, :, mine])
        assert torch.equal(mlp.input_linear.weight, torch.cat([shared_in[:S][smine], shared_in[S:][smine]]))
        assert torch.equal(mlp.output_linear.weight, shared_out[:, smine])


def test_expert_parallel_rank_slices():
    E, I = 4, 8
    gate_up, down = torch.randn(E, 2 * I, HID), torch.randn(E, HID, I)
    x, half = torch.randn(3, HID), torch.full((3, 2), 0.5)
    for rank in range(2):
        with _as_rank(rank, 2, expert_parallel=True):
            moe = _moe(E, I)
        _load(moe, {"router.weight": torch.randn(E, HID), "experts.w13.weight": gate_up,
                    "experts.w2.weight": down})
        experts = moe.experts
        mine, theirs = [2 * rank, 2 * rank + 1], [2 - 2 * rank, 3 - 2 * rank]
        assert torch.equal(experts.w13.weight, gate_up[mine]) and torch.equal(experts.w2.weight, down[mine])
        # tokens routed only to the other rank's experts get nothing here
        assert torch.count_nonzero(experts(x, half, torch.tensor([theirs] * 3))) == 0
        got = experts(x, half, torch.tensor([[mine[0], theirs[0]]] * 3))
        g, u = F.linear(x, gate_up[mine[0]]).chunk(2, dim=-1)
        assert torch.allclose(got, 0.5 * F.linear(F.silu(g) * u, down[mine[0]]), atol=1e-6)
    with _as_rank(0, 4, expert_parallel=True), pytest.raises(
            ValueError, match=r"num_local_experts \(split by expert parallelism\)=6 is not divisible"):
        _moe(6, I)


def test_tp_bad_sizes_are_named():
    from core_runner.layers import Mamba2Mixer

    heads6 = "mamba num_heads=6 is not divisible by tensor_parallel_size=4"

    with _as_rank(0, 2), pytest.raises(ValueError, match="n_groups=3 and tensor_parallel_size=2"):
        Mamba2Mixer(HID, num_heads=6, head_dim=P, d_state=N, n_groups=3)
    with _as_rank(0, 4), pytest.raises(ValueError, match=heads6):
        Mamba2Mixer(HID, num_heads=6, head_dim=P, d_state=N, n_groups=1)
    with _as_rank(1, 4), pytest.raises(ValueError, match=r"intermediate_size \(of each expert\)=6 is not divisible"):
        _moe(2, 6)
    with _as_rank(1, 2):
        m, experts = _mixer(1), _moe(2, 8).experts
    rows = 2 * H * P + 2 * N + H
    with pytest.raises(ValueError, match=rf"in_proj: checkpoint tensor has shape \({rows + 1}, {HID}\), "
                                         rf"expected \({rows}, {HID}\)"):
        m.in_proj.weight_loader(m.in_proj.weight, torch.zeros(rows + 1, HID))
    with pytest.raises(ValueError, match=r"stacked expert tensor has shape \(2, 16, 4\), expected \(2, 16, 8\)"):
        experts.w2.weight.weight_loader(experts.w2.weight, torch.zeros(2, HID, 4))


def test_parallel_capabilities_declared():
    """The plugin and registry.toml both declare what these tests prove."""
    from pathlib import Path

    import tomllib

    from core_runner.plugins import load_plugins

    reg = load_plugins().registry.get("GraniteMoeHybridForCausalLM")
    table = tomllib.loads((Path(__file__).parents[1] / "registry.toml").read_text())["architectures"]
    for cap in ("tensor_parallel", "expert_parallel"):
        assert reg.capability(cap).state == "supported", cap
        assert table["GraniteMoeHybridForCausalLM"]["capabilities"][cap] == "supported", cap
