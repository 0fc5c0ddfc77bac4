"""DeepSeek-V3's MTP layers as a speculative-decoding draft (core_runner_deepseek.mtp).

The module alone, on tiny checkpoints of ``mtp_fixture`` (loaded through the engine's own
draft building, run over a paged latent cache with the torch backend), against a
from-scratch float32 reference: the first pass over a sequence, then decode passes that
extend it; the layer a pass picks when there are two; the copies of the target's
embedding and head dropped for the target's own; an fp8 checkpoint. Then through the
engine: the proposals the runner writes equal the reference's; greedy and seeded outputs
equal those without speculation (k = 1 and 3, chunked prefill, preemption, a dry pool,
tensor parallelism, prefix caching); an MTP layer built to compute the target's own next-token logits is
(near) always accepted. Last, refusals.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import drain, greedy, make_engine, random_prompts, run, step_until
from mtp_fixture import CONFIG, build_mtp_checkpoint, mtp_reference, target_hidden
from test_spec_decode import seeded

from core_runner.attention.backend import AttnMetadata
from core_runner.attention.torch_backend import TorchPagedAttention
from core_runner.forward_context import set_forward_context

ARCH = "DeepseekV3ForCausalLM"
ATOL = 1e-4


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, single_torch_thread):
    root = tmp_path_factory.mktemp("mtp")
    return {
        # embed_tokens / shared_head.head copies of the target's, as DeepSeek-V3 ships them
        "one": build_mtp_checkpoint(root / "one"),
        # two layers with their own embedding and heads
        "two": build_mtp_checkpoint(root / "two", num_mtp=2, seed=1, share_embed_head=False),
    }


def build(path: str | Path):
    """(target, draft) as a rank builds them (core_runner.executor.build)."""
    from core_runner.executor.draft import DraftSpec, build_draft
    from core_runner.loader import build_model, load_hf_config
    from core_runner.plugins import load_plugins

    registry = load_plugins(["deepseek"]).registry
    cfg = load_hf_config(path)
    target = build_model(registry.get(ARCH).load_model_class(), cfg, torch.float32, "cpu", path)
    spec = DraftSpec(registry.get_draft(ARCH, "mtp"), cfg, str(path))
    return target, build_draft(spec, target, cfg, torch.float32, "cpu", "auto", seed=0)


class OneSequence:
    """Runs a draft alone over one growing sequence: its own latent caches on a shuffled
    block table, and each pass's metadata (the new tokens follow those already cached)."""

    def __init__(self, draft: torch.nn.Module, max_len: int = 64, block_size: int = 4) -> None:
        self.draft, self.bs, self.len = draft, block_size, 0
        num_blocks = -(-max_len // block_size)
        self.table = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).to(torch.int32)
        for name, module in draft.named_modules():
            if callable(getattr(module, "kv_cache_spec", None)):
                module.kv_cache = module.kv_cache_spec(name, torch.float32).allocate(num_blocks, block_size, "cpu")

    @torch.no_grad()
    def run(self, tokens: list[int], hidden: torch.Tensor, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, hidden for the next pass) of ``tokens`` at the next positions."""
        q = len(tokens)
        pos = torch.arange(self.len, self.len + q)
        slots = self.table[pos // self.bs].long() * self.bs + pos % self.bs
        qsl, lens = torch.tensor([0, q], dtype=torch.int32), torch.tensor([self.len + q], dtype=torch.int32)
        md = AttnMetadata(num_reqs=1, num_tokens=q, query_start_loc=qsl, seq_lens=lens, block_tables=self.table[None],
                          slot_mapping=slots, query_start_loc_cpu=qsl, seq_lens_cpu=lens, max_query_len=q,
                          max_seq_len=self.len + q)
        with set_forward_context(md, TorchPagedAttention(), "torch"):
            out, nxt = self.draft(torch.tensor(tokens), pos, hidden, spec_step_idx=step)
            logits = self.draft.compute_logits(out, step)
        self.len += q
        return logits, nxt


def seq_of(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_first_pass_then_decode_passes_match_the_reference(ckpts):
    ckpt = ckpts["one"]
    _, draft = build(ckpt.path)
    seq = seq_of(21, seed=3)
    hidden = target_hidden(ckpt, seq)
    # first pass: position p reads the token at p + 1 and the target's hidden state at p
    run = OneSequence(draft)
    logits, nxt = run.run(seq[1:], hidden[:-1])
    want_logits, want_y = mtp_reference(ckpt, 0, seq[1:], hidden[:-1])
    assert (logits - want_logits).abs().max() <= ATOL
    assert (nxt - want_y).abs().max() <= ATOL
    assert want_logits.std() > 0.5  # the comparison is not between near-constant rows
    # three decode passes: each reads the draft's own last hidden and the token it proposed
    tokens, hiddens = list(seq[1:]), hidden[:-1]
    for _ in range(3):
        proposal = int(logits[-1].argmax())
        tokens.append(proposal)
        hiddens = torch.cat([hiddens, nxt[-1:]])
        logits, nxt = run.run([proposal], nxt[-1:])
        want_logits, want_y = mtp_reference(ckpt, 0, tokens, hiddens)
        assert (logits[0] - want_logits[-1]).abs().max() <= ATOL
        assert (nxt[0] - want_y[-1]).abs().max() <= ATOL


def test_a_pass_runs_the_layer_of_its_step(ckpts):
    ckpt = ckpts["two"]
    _, draft = build(ckpt.path)
    n = ckpt.num_hidden_layers
    assert sorted(draft.layers) == [str(n), str(n + 1)]
    seq = seq_of(13, seed=4)
    hidden = target_hidden(ckpt, seq)
    wants = [mtp_reference(ckpt, i, seq[1:], hidden[:-1])[0] for i in (0, 1)]
    assert (wants[0] - wants[1]).abs().max() > 0.1
    for step, layer in ((0, 0), (1, 1), (2, 0), (3, 1)):
        logits, _ = OneSequence(draft).run(seq[1:], hidden[:-1], step=step)
        assert (logits - wants[layer]).abs().max() <= ATOL, f"step {step}"


def test_embedding_and_heads_are_the_targets_where_the_checkpoint_copies_them(ckpts):
    target, shared = build(ckpts["one"].path)
    assert shared.embed_tokens is target.model.embed_tokens
    assert all(layer.shared_head.head is target.lm_head for layer in shared.layers.values())
    names = {name for name, _ in shared.named_parameters()}
    assert not any("embed_tokens" in name or "shared_head.head" in name for name in names)
    assert any("shared_head.norm" in name for name in names)
    # the per-expert tensors went into the fused experts of the MTP layer's MoE
    n = ckpts["one"].num_hidden_layers
    assert f"layers.{n}.mtp_block.mlp.experts.w13.weight" in names
    target, own = build(ckpts["two"].path)
    assert own.embed_tokens is not target.model.embed_tokens
    assert {name for name, _ in own.named_parameters()} >= {
        "embed_tokens.weight", f"layers.{n}.shared_head.head.weight", f"layers.{n + 1}.shared_head.head.weight"}
    # one embedding for both layers: the first layer's (its copy in layer n + 1 is not read)
    assert torch.equal(own.embed_tokens.weight, ckpts["two"].refs[0].model.embed_tokens.weight)


def test_fp8_checkpoint_loads_dequantized(ckpts, tmp_path):
    """The 'one' checkpoint in DeepSeek-V3's fp8 format (every projection of the target and
    the MTP layer, eh_proj included, fp8 with ``weight_scale_inv``, over two shards): the
    draft holds the dequantized weights and computes what one built from them does."""
    from helpers import read_checkpoint
    from test_fp8 import QUANT, UNQUANTIZED, _write_shards

    from core_runner.quantization import dequantize_fp8_block, quantize_fp8_block

    src = Path(ckpts["one"].path)
    config = json.loads((src / "config.json").read_text())
    fp8, deq = {}, {}
    for name, w in read_checkpoint(src).items():
        if UNQUANTIZED.search(name) or "shared_head.head" in name or w.dim() != 2:
            fp8[name] = deq[name] = w
            continue
        q, scale = quantize_fp8_block(w, tuple(QUANT["weight_block_size"]))
        fp8[name], fp8[name + "_scale_inv"] = q, scale
        deq[name] = dequantize_fp8_block(q, scale, tuple(QUANT["weight_block_size"]), torch.float32, name)
    n = config["num_hidden_layers"]
    assert f"model.layers.{n}.eh_proj.weight_scale_inv" in fp8
    _write_shards(tmp_path / "fp8", fp8, {**config, "quantization_config": QUANT})
    _write_shards(tmp_path / "deq", deq, config)
    _, quantized = build(tmp_path / "fp8")
    _, reference = build(tmp_path / "deq")
    assert torch.equal(quantized.layers[str(n)].eh_proj.weight, deq[f"model.layers.{n}.eh_proj.weight"])
    seq = seq_of(9, seed=5)
    hidden = target_hidden(ckpts["one"], seq)[:-1]
    got, _ = OneSequence(quantized).run(seq[1:], hidden)
    want, _ = OneSequence(reference).run(seq[1:], hidden)
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------------
# through the engine
# ---------------------------------------------------------------------------------
PROMPTS = random_prompts([3, 9, 17, 30, 5], seed=21)


def mtp(k: int) -> dict:
    return {"method": "mtp", "num_speculative_tokens": k}


def tokens_of(engine, prompts, params) -> dict[str, list[int]]:
    params = params if isinstance(params, list) else [params] * len(prompts)
    outs = run(engine, [(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, params))])
    return {r: list(o.outputs[0].token_ids) for r, o in outs.items()}


@pytest.fixture(scope="module")
def plain(ckpts):
    """Greedy outputs of the 'one' checkpoint without speculation."""
    return tokens_of(make_engine(ckpts["one"]), PROMPTS, greedy(20))


@pytest.mark.parametrize("k", [1, 3])
def test_random_mtp_is_lossless_greedy_and_chunked(ckpts, plain, k):
    engine = make_engine(ckpts["one"], speculative_config=mtp(k))
    assert tokens_of(engine, PROMPTS, greedy(20)) == plain
    assert engine.scheduler.spec_num_draft_tokens > 0
    chunked = make_engine(ckpts["one"], speculative_config=mtp(k), max_num_batched_tokens=8)
    steps = chunked.debug.record_steps()
    assert tokens_of(chunked, PROMPTS, greedy(20)) == plain
    assert max(s.num_tokens for s in steps) <= 8 and chunked.scheduler.spec_num_draft_tokens > 0


def test_preemption_and_a_dry_pool_are_lossless(ckpts, plain):
    engine = make_engine(ckpts["one"], speculative_config=mtp(3), max_num_batched_tokens=16)
    total = engine.debug.num_free_blocks
    steps = engine.debug.record_steps()
    for i, p in enumerate(PROMPTS):
        engine.add_request(p, greedy(20), req_id=str(i))
    done: dict = {}
    step_until(engine, done, lambda: any(s.num_scheduled.get("3", 0) > 1 for s in steps))
    engine.debug.preempt("3")
    drain(engine, done)
    assert {r: list(o.outputs[0].token_ids) for r, o in done.items()} == plain
    assert done["3"].num_preemptions == 1 and done["3"].num_draft_tokens > 0
    engine.step()  # the last finished id reaches the runner
    assert engine.debug.num_free_blocks == total  # lookahead blocks included
    # ~12 blocks per request and 24 in the pool: the draft's lookahead pushes requests out
    dry = make_engine(ckpts["one"], speculative_config=mtp(3), num_kv_blocks=24, max_model_len=64)
    assert tokens_of(dry, PROMPTS, greedy(20)) == plain
    assert dry.debug.num_preemptions > 0


def test_prefix_caching_and_the_draft_latent_cache(ckpts, plain):
    cfg = ckpts["one"].config
    engine = make_engine(ckpts["one"], speculative_config=mtp(3), enable_prefix_caching=True)
    # the MTP layer's latent cache sits in the pool beside the target's layers
    latent = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 4
    assert engine.memory_report()["kv_bytes_per_token"] == latent * (cfg["num_hidden_layers"] + 1)
    assert any(name.startswith("kv.drafter.") for name in engine.debug.paged_caches())
    assert tokens_of(engine, PROMPTS, greedy(20)) == plain
    # again, from cached blocks (less the last one, whose draft KV read the token after it)
    outs = run(engine, [(f"b{i}", p, greedy(20)) for i, p in enumerate(PROMPTS)])
    assert {r[1:]: list(o.outputs[0].token_ids) for r, o in outs.items()} == plain
    assert outs["b3"].num_cached_tokens == (len(PROMPTS[3]) - 1) // 4 * 4 - 4


def test_seeded_sampling_is_lossless(ckpts):
    params = [seeded(16, 100 + i, 0.8, 0.9) for i in range(len(PROMPTS))]
    want = tokens_of(make_engine(ckpts["one"]), PROMPTS, params)
    assert tokens_of(make_engine(ckpts["one"], speculative_config=mtp(3)), PROMPTS, params) == want


def test_engine_proposals_are_the_reference_ones(ckpts):
    """Before each step, the k proposals the runner wrote after a request's known tokens S
    equal the reference's: a first pass over S (token at p + 1, target hidden at p), then
    decode passes on the draft's own hidden states and proposals."""
    ckpt, k = ckpts["one"], 3
    engine = make_engine(ckpt, speculative_config=mtp(k))
    seen = []

    def look(_out) -> None:
        row = engine.debug.row_of("0")
        if row is not None:
            tables = engine.debug.row_tables()
            n = int(tables["req_state.num_tokens"][row])
            known = tables["req_state.token_ids"][row]
            seen.append((known[:n].tolist(), known[n:n + k].tolist()))

    engine.debug.before_step(look)
    prompt = PROMPTS[2]
    run(engine, [("0", prompt, greedy(16))])
    speculated = [(s, d) for s, d in seen if len(s) > len(prompt)]
    assert len(speculated) >= 6
    for known, proposals in speculated:
        hidden = target_hidden(ckpt, known)
        tokens, hiddens = known[1:], hidden[:-1]
        logits, y = mtp_reference(ckpt, 0, tokens, hiddens)
        want = []
        for _ in range(k):
            want.append(int(logits[-1].argmax()))
            tokens, hiddens = tokens + want[-1:], torch.cat([hiddens, y[-1:]])
            logits, y = mtp_reference(ckpt, 0, tokens, hiddens)
        assert proposals == want, f"after {len(known)} tokens"


def test_tensor_parallel_with_mtp(ckpts, plain):
    from core_runner import LLM

    llm = LLM(ckpts["one"].path, tensor_parallel_size=2, speculative_config=mtp(3), device="cpu", dtype="float32",
              max_model_len=64, block_size=4, max_num_seqs=8, num_kv_blocks=128)
    try:
        outs = llm.generate(PROMPTS, greedy(20), use_tqdm=False)
    finally:
        llm.engine.shutdown()
    assert [list(o.outputs[0].token_ids) for o in outs] == [plain[str(i)] for i in range(len(PROMPTS))]
    assert sum(o.num_draft_tokens for o in outs) > 0


def copy_the_target(target, refs, own) -> None:
    """An attention-free one-layer target (o_proj zero, layer 0 dense: each position's
    logits depend on its own token only) and an MTP layer that computes the target's
    logits of the token it reads: embedding rows of RMS 1 with enorm 1 and eh_proj = [I | 0]
    (x = the token's embedding), attention zero, every routed expert the target's MLP and
    the shared expert zero (renormalised routing weights x routed_scaling_factor 1 sum to
    1, so the MoE is that MLP), the target's post-attention norm, final norm and head. At
    position p it reads the token at p + 1 and proposes the target's next greedy token."""
    t, m = target.model, refs[0].model
    emb = t.embed_tokens.weight
    emb.copy_(emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True)))
    t.layers[0].self_attn.o_proj.weight.zero_()
    block, mlp = m.layers[0], t.layers[0].mlp
    block.self_attn.o_proj.weight.zero_()
    block.post_attention_layernorm.weight.copy_(t.layers[0].post_attention_layernorm.weight)
    experts = block.mlp.experts  # transformers keeps them stacked: [E, 2I, H] (gate rows, then up) and [E, H, I]
    experts.gate_up_proj.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).expand_as(experts.gate_up_proj))
    experts.down_proj.copy_(mlp.down_proj.weight.expand_as(experts.down_proj))
    block.mlp.shared_experts.down_proj.weight.zero_()
    m.embed_tokens.weight.copy_(emb)
    m.norm.weight.copy_(t.norm.weight)
    refs[0].lm_head.weight.copy_(target.lm_head.weight)
    h = emb.shape[1]
    own[0]["enorm"] = torch.ones(h)
    own[0]["eh_proj"] = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)


@pytest.mark.parametrize("k", [1, 3])
def test_an_mtp_layer_that_copies_the_target_is_accepted(tmp_path_factory, single_torch_thread, k):
    path = tmp_path_factory.mktemp("mtp_copy") / "copy"
    ckpt = build_mtp_checkpoint(path, seed=2, num_hidden_layers=1, first_k_dense_replace=1,
                                moe_intermediate_size=CONFIG["intermediate_size"], n_shared_experts=1,
                                routed_scaling_factor=1.0, norm_topk_prob=True, edit=copy_the_target)
    want = tokens_of(make_engine(ckpt), PROMPTS, greedy(24))
    engine = make_engine(ckpt, speculative_config=mtp(k))
    outs = run(engine, [(str(i), p, greedy(24)) for i, p in enumerate(PROMPTS)])
    assert {r: list(o.outputs[0].token_ids) for r, o in outs.items()} == want
    s = engine.scheduler
    assert s.spec_num_draft_tokens >= 10 * k
    assert s.spec_num_accepted_tokens >= 0.9 * s.spec_num_draft_tokens, (s.spec_num_accepted_tokens,
                                                                        s.spec_num_draft_tokens)
    assert sum(o.num_accepted_tokens for o in outs.values()) == s.spec_num_accepted_tokens


# ---------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------
def _copy(src: str, dst: Path, **config) -> str:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    return str(dst)


def _engine(path: str, k: int = 2):
    from core_runner import LLM

    return LLM(path, dtype="float32", device="cpu", max_model_len=64, block_size=4, num_kv_blocks=64,
               speculative_config={"method": "mtp", "num_speculative_tokens": k})


def test_a_config_without_mtp_layers_is_refused(ckpts, tmp_path):
    path = _copy(ckpts["one"].path, tmp_path / "zero", num_nextn_predict_layers=0)
    with pytest.raises(ValueError, match=re.escape("method 'mtp' needs next-token-prediction layers in the target's "
                                                   "checkpoint, but its config has num_nextn_predict_layers=0")):
        _engine(path)


def test_a_checkpoint_saved_without_its_mtp_layers_is_refused(ckpts, tmp_path):
    # transformers writes num_nextn_predict_layers=1 (its default) but never the layer itself
    path = _copy(ckpts["one"].path, tmp_path / "bare")
    (Path(path) / "mtp.safetensors").unlink()
    with pytest.raises(ValueError, match=re.escape("the checkpoint has no tensors of its multi-token-prediction "
                                                   "layer 'model.layers.3.*'")):
        _engine(path)


def test_deepseek_v2_has_no_mtp_draft(tmp_path):
    import transformers
    from core_runner_deepseek.hooks import TINY_V2

    cfg = transformers.DeepseekV2Config(**TINY_V2, num_nextn_predict_layers=1)
    transformers.DeepseekV2ForCausalLM(cfg).save_pretrained(str(tmp_path / "v2"))
    with pytest.raises(ValueError, match=re.escape("no 'mtp' draft model is registered for the target architecture "
                                                   "'DeepseekV2ForCausalLM'")):
        _engine(str(tmp_path / "v2"))
