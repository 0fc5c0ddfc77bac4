"""EAGLE and EAGLE-3 speculative decoding (``core_runner_qwen3.eagle``, drafts from tiny
checkpoints written by ``tests/eagle_fixtures.py``).

- The targets' aux hidden states (Qwen3 and the Llama template) equal transformers'
  residual stream entering each chosen layer; without them forward returns a tensor.
- Each draft, loaded as the engine loads it (``build_draft``: its checkpoint, the
  target's shared modules, the target's aux layers set), computes on a prefill then a
  decode pass what a plain-torch reference of its formulas computes from the files.
- Through the engine, greedy and seeded outputs with speculation equal those without,
  and a draft that copies the target has nearly every proposal accepted.
- Refusals name what is wrong.
"""
from __future__ import annotations

import json

import pytest
import torch
from eagle_fixtures import OneSequence, eagle3_ref, eagle_ref, weights, write_eagle, write_eagle3
from helpers import drain, greedy, make_engine, random_prompts, run, sampled, step_until

from core_runner.executor.draft import DraftSpec, build_draft
from core_runner.loader import build_model, load_hf_config
from core_runner.plugins import load_plugins

TARGET_LAYERS_QWEN3 = (0, 1, 1)  # the tiny targets have two layers; a layer may be read twice
T = 40  # tokens of the module-level runs: past the drafts' max_position_embeddings (32), within the target's


@pytest.fixture(scope="module")
def registry():
    return load_plugins().registry


@pytest.fixture(scope="module")
def template_target(tmp_path_factory, single_torch_thread):
    """A tiny random LlamaForCausalLM (the template plugin's family), three layers."""
    import test_tp_template
    import transformers
    from helpers import Checkpoint

    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(**{**test_tp_template.BASE, "num_hidden_layers": 3, "max_position_embeddings": 256},
                                   **test_tp_template.CHECKPOINTS["gqa"])
    hf = transformers.LlamaForCausalLM(cfg).float().eval()
    path = tmp_path_factory.mktemp("eagle_llama") / "target"
    hf.save_pretrained(str(path))
    return Checkpoint("template", str(path), hf, vocab=test_tp_template.VOCAB)


def core_model(registry, ckpt):
    """The engine's model of a checkpoint, built and loaded outside the engine."""
    cfg = load_hf_config(ckpt.path)
    cls = registry.get(cfg.architectures[0]).load_model_class()
    return build_model(cls, cfg, torch.float32, "cpu", ckpt.path), cfg


def hf_streams(ckpt, ids: list[int]) -> tuple[torch.Tensor, ...]:
    """transformers' hidden_states: entry i < L is the residual stream entering layer i,
    the last one the final (normed) output."""
    with torch.no_grad():
        out = ckpt.hf(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return tuple(h[0] for h in out.hidden_states)


# ---------------------------------------------------------------------------------
# the targets' aux hidden states
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["qwen3", "template"])
def test_target_aux_hidden_states_equal_transformers(registry, untied, template_target, which):
    ckpt = untied if which == "qwen3" else template_target
    model, cfg = core_model(registry, ckpt)
    n = cfg.num_hidden_layers
    assert model.get_eagle3_aux_hidden_state_layers() == (2, n // 2, n - 3)
    ids = torch.randint(0, ckpt.vocab, (11,), generator=torch.Generator().manual_seed(4))
    positions = torch.arange(11)
    ref = hf_streams(ckpt, ids.tolist())
    run = OneSequence(model)
    with torch.no_grad(), run.tokens(0, 11):
        plain = model(ids, positions)
    assert isinstance(plain, torch.Tensor)  # nothing asked for: the plain hidden states
    torch.testing.assert_close(plain, ref[-1], atol=1e-4, rtol=0)
    layers = tuple(range(n - 1, -1, -1)) + (n - 1,)  # given out of order, one twice: handed over in layer order
    model.set_aux_hidden_state_layers(layers)
    with torch.no_grad(), run.tokens(0, 11):
        hidden, aux = model(ids, positions)
    torch.testing.assert_close(hidden, plain, atol=0, rtol=0)
    assert len(aux) == len(layers)
    for got, layer in zip(aux, sorted(layers), strict=True):
        torch.testing.assert_close(got, ref[layer], atol=1e-4, rtol=0, msg=f"{which}: input of layer {layer}")
    with pytest.raises(ValueError, match=rf"aux hidden state layers \[0, {n}\]: \[{n}\] are not layers of a model "
                                         rf"with num_hidden_layers={n}"):
        model.set_aux_hidden_state_layers((0, n))
    model.set_aux_hidden_state_layers(())
    with torch.no_grad(), run.tokens(0, 11):
        assert isinstance(model(ids, positions), torch.Tensor)


# ---------------------------------------------------------------------------------
# the drafts against the references
# ---------------------------------------------------------------------------------
EAGLE_VARIANTS = {
    # the published layout: no prefix, the target's embedding and LM head
    "plain": dict(),
    # a converted layout: model.* names, an embedding of its own, fc with a bias, a stray input norm
    "prefixed": dict(prefixed=True, with_embed=True, fc_bias=True, stray_input_norm=True,
                     arch="EagleLlamaForCausalLM"),
}
EAGLE3_VARIANTS = {
    "midlayer": dict(layer_ids=list(TARGET_LAYERS_QWEN3)),
    "layers0-embed": dict(layer_ids=[1, 0, 1], midlayer=False, with_embed=True, arch="Eagle3LlamaForCausalLM"),
    "norm-before-residual": dict(layer_ids=list(TARGET_LAYERS_QWEN3), norm_before_residual=True),
}


def load_draft(registry, method: str, path: str, target, target_cfg):
    cfg = load_hf_config(path)
    spec = DraftSpec(registry.get_draft(cfg.architectures[0], method), cfg, path)
    return build_draft(spec, target, target_cfg, torch.float32, "cpu", "auto", 0)


def two_passes(draft, run: OneSequence, ids: torch.Tensor, hidden: torch.Tensor):
    """The draft over positions 0..T-2 (a first pass), then T-1 alone reading the first
    pass's last hidden_for_next (a decode pass): (outputs, hidden inputs) of all T."""
    t = ids.shape[0]
    with torch.no_grad():
        with run.tokens(0, t - 1):
            out1, nxt1 = draft(ids[:-1], torch.arange(t - 1), hidden[: t - 1])
        with run.tokens(t - 1, 1):
            out2, nxt2 = draft(ids[-1:], torch.tensor([t - 1]), nxt1[-1:], spec_step_idx=1)
    return torch.cat([out1, out2]), torch.cat([nxt1, nxt2]), torch.cat([hidden[: t - 1], nxt1[-1:]])


@pytest.mark.parametrize("variant", sorted(EAGLE_VARIANTS))
def test_eagle_draft_equals_reference(registry, untied, tmp_path, variant):
    target, tcfg = core_model(registry, untied)
    path = write_eagle(tmp_path / "draft", untied.vocab, seed=11, **EAGLE_VARIANTS[variant])
    draft = load_draft(registry, "eagle", path, target, tcfg)
    assert draft.aux_hidden_state_layers(tcfg) is None
    own = {n for n, _ in draft.named_parameters()}
    assert ("embed_tokens.weight" in own) == (variant == "prefixed") and "lm_head.weight" not in own
    assert "layers.0.input_layernorm.weight" not in own
    # the first pass reads the target's final hidden states at positions 0..T-2
    prompt = torch.randint(0, untied.vocab, (T,), generator=torch.Generator().manual_seed(5))
    target_hidden = torch.stack(hf_streams(untied, prompt.tolist()))[-1]
    ids = prompt.roll(-1)  # position p reads token p + 1
    hidden = draft.combine_hidden_states(target_hidden)
    out, nxt, hidden_in = two_passes(draft, OneSequence(draft), ids, hidden)
    assert torch.equal(out, nxt)
    ref = eagle_ref(path, untied.hf.model.embed_tokens.weight.detach(), ids, hidden_in, torch.arange(T))
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        logits = draft.compute_logits(out)
    torch.testing.assert_close(logits, ref @ untied.hf.lm_head.weight.detach().T, atol=1e-3, rtol=1e-4)
    assert torch.equal(draft.draft_token_ids(logits), logits.argmax(-1))


@pytest.mark.parametrize("variant", sorted(EAGLE3_VARIANTS))
def test_eagle3_draft_equals_reference(registry, untied, tmp_path, variant):
    target, tcfg = core_model(registry, untied)
    spec = EAGLE3_VARIANTS[variant]
    path = write_eagle3(tmp_path / "draft", untied.vocab, draft_vocab=64, seed=12, **spec)
    draft = load_draft(registry, "eagle3", path, target, tcfg)
    layers = tuple(sorted(spec["layer_ids"]))
    assert target.model.aux_layers == layers  # build_draft told the target which states to return
    prompt = torch.randint(0, untied.vocab, (T,), generator=torch.Generator().manual_seed(6))
    streams = hf_streams(untied, prompt.tolist())
    aux = torch.cat([streams[i] for i in layers], -1)
    with torch.no_grad(), OneSequence(target).tokens(0, T):  # the target hands over the same states
        torch.testing.assert_close(torch.cat(target(prompt, torch.arange(T))[1], -1), aux, atol=1e-4, rtol=0)
    with torch.no_grad():
        hidden = draft.combine_hidden_states(aux)
    cfg, tensors = weights(path)
    torch.testing.assert_close(hidden, aux @ tensors["fc.weight"].T, atol=1e-5, rtol=1e-5)
    ids = prompt.roll(-1)
    normed, pre, hidden_in = two_passes(draft, OneSequence(draft), ids, hidden)
    ref_normed, ref_pre = eagle3_ref(path, untied.hf.model.embed_tokens.weight.detach(), ids, hidden_in,
                                     torch.arange(T))
    torch.testing.assert_close(pre, ref_pre, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(normed, ref_normed, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        logits = draft.compute_logits(normed)
    assert logits.shape == (T, cfg["draft_vocab_size"]) == (T, 64)
    torch.testing.assert_close(logits, ref_normed @ tensors["lm_head.weight"].T, atol=1e-3, rtol=1e-4)
    proposals = draft.draft_token_ids(logits)
    best = logits.argmax(-1)
    assert torch.equal(proposals, best + tensors["d2t"][best])
    assert bool(tensors["t2d"][proposals].all())  # every proposal is a target id the draft vocabulary covers
    assert not torch.equal(proposals, best)  # the table moved them


def test_eagle3_default_target_layers(registry, untied, tmp_path):
    """Without eagle_config the draft reads vLLM's default layers (2, L // 2, L - 3)."""
    from core_runner_qwen3.eagle import Eagle3LlamaForCausalLM

    path = write_eagle3(tmp_path / "d", untied.vocab, draft_vocab=64, seed=1, layer_ids=None)
    cfg, tcfg = load_hf_config(path), load_hf_config(untied.path)
    tcfg.num_hidden_layers = 28
    draft = Eagle3LlamaForCausalLM(cfg, tcfg, frozenset(["d2t"]))
    assert draft.aux_hidden_state_layers(tcfg) == (2, 14, 25)
    assert tuple(draft.fc.weight.shape) == (64, 3 * 64)


# ---------------------------------------------------------------------------------
# through the engine
# ---------------------------------------------------------------------------------
# the target layers each EAGLE-3 draft reads (the Qwen3 target has two layers, the template three)
E2E_LAYERS = {"qwen3": [0, 1, 1], "template": [0, 1, 2]}


@pytest.fixture(scope="module")
def drafted(tmp_path_factory, untied, template_target):
    """{(target, method): (target checkpoint, draft path)}: a random draft of each kind per target."""
    root = tmp_path_factory.mktemp("eagle_drafts")
    out = {}
    for name, ckpt in (("qwen3", untied), ("template", template_target)):
        out[name, "eagle"] = ckpt, write_eagle(root / f"{name}-eagle", ckpt.vocab, seed=21)
        out[name, "eagle3"] = ckpt, write_eagle3(root / f"{name}-eagle3", ckpt.vocab, draft_vocab=64, seed=22,
                                                 layer_ids=E2E_LAYERS[name])
    return out


def spec(method: str, k: int, path: str) -> dict:
    return {"method": method, "num_speculative_tokens": k, "model": path}


def all_tokens(engine, prompts: list[list[int]], params) -> dict:
    plist = params if isinstance(params, list) else [params] * len(prompts)
    outs = run(engine, [(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, plist))])
    return {r: list(o.outputs[0].token_ids) for r, o in outs.items()}


def verifying(steps, req_id: str, prompt_len: int):
    return lambda: any(s.num_scheduled.get(req_id, 0) > 1 and s.num_computed[req_id] >= prompt_len for s in steps)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("target", ["qwen3", "template"])
def test_greedy_equal_without_speculation(drafted, target, method, k):
    """One-step and chunked prefill (8-token budget), with a request preempted while it
    verifies proposals: the random draft's proposals are mostly rejected, and every
    output equals the target's own greedy output."""
    ckpt, path = drafted[target, method]
    prompts = random_prompts([3, 9, 17, 30, 5], seed=21, vocab=ckpt.vocab)
    want = all_tokens(make_engine(ckpt), prompts, greedy(16))
    engine = make_engine(ckpt, speculative_config=spec(method, k, path))
    assert all_tokens(engine, prompts, greedy(16)) == want
    assert engine.scheduler.spec_num_draft_tokens > 0
    engine = make_engine(ckpt, speculative_config=spec(method, k, path), max_num_batched_tokens=8, max_num_seqs=4)
    steps = engine.debug.record_steps()
    for i, p in enumerate(prompts):
        engine.add_request(p, greedy(16), req_id=str(i))
    done: dict = {}
    step_until(engine, done, verifying(steps, "3", len(prompts[3])))
    engine.debug.preempt("3")
    drain(engine, done)
    assert {r: list(o.outputs[0].token_ids) for r, o in done.items()} == want
    assert done["3"].num_preemptions == 1 and done["3"].num_draft_tokens > 0
    assert max(s.num_tokens for s in steps) <= 8


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("target", ["qwen3", "template"])
def test_seeded_sampling_equal_without_speculation(drafted, target, method):
    ckpt, path = drafted[target, method]
    prompts = random_prompts([4, 12, 20], seed=9, vocab=ckpt.vocab)
    params = [sampled(14, seed=100 + i, temperature=0.8, top_p=0.9) for i in range(len(prompts))]
    want = all_tokens(make_engine(ckpt), prompts, params)
    engine = make_engine(ckpt, speculative_config=spec(method, 3, path))
    assert all_tokens(engine, prompts, params) == want
    assert engine.scheduler.spec_num_draft_tokens > 0


@pytest.fixture(scope="module")
def copied(tmp_path_factory, single_torch_thread):
    """A one-layer Qwen3 target whose attention adds nothing (o_proj zero) and whose final
    norm is all ones, so its next-token logits are lm_head(s / rms(s)) with s = e + mlp(
    post_attention_layernorm(e)), e the embedding of the current token; and an EAGLE draft
    that computes lm_head(s) from the token it reads: fc = [I | 0] keeps the embedding,
    its attention adds nothing, its MLP and post-attention norm are the target's, its
    embedding and LM head are shared. It proposes the target's greedy tokens."""
    import transformers
    from helpers import TINY, Checkpoint
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("eagle_copy")
    torch.manual_seed(7)
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**TINY, "num_hidden_layers": 1,
                                                                   "tie_word_embeddings": False})).float().eval()
    layer = hf.model.layers[0]
    with torch.no_grad():
        layer.self_attn.o_proj.weight.zero_()
        hf.model.norm.weight.fill_(1.0)
    hf.save_pretrained(str(root / "target"))
    path = write_eagle(root / "draft", TINY["vocab_size"], seed=8)
    w = load_file(f"{path}/model.safetensors")
    h = TINY["hidden_size"]
    w["fc.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)
    w["layers.0.self_attn.o_proj.weight"].zero_()
    w["layers.0.post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight.detach().clone()
    for proj in ("gate_proj", "up_proj", "down_proj"):
        w[f"layers.0.mlp.{proj}.weight"] = getattr(layer.mlp, proj).weight.detach().clone()
    # the draft's MLP is as wide as the target's
    cfg = json.loads((root / "draft" / "config.json").read_text())
    (root / "draft" / "config.json").write_text(json.dumps({**cfg, "intermediate_size": TINY["intermediate_size"]}))
    save_file(w, f"{path}/model.safetensors")
    return Checkpoint("copied", str(root / "target"), hf), path


@pytest.mark.parametrize("k", [1, 3])
def test_eagle_draft_that_copies_the_target_is_accepted(copied, k):
    ckpt, path = copied
    prompts = random_prompts([3, 9, 17, 30, 5], seed=21)
    want = all_tokens(make_engine(ckpt), prompts, greedy(24))
    engine = make_engine(ckpt, speculative_config=spec("eagle", k, path))
    assert all_tokens(engine, prompts, greedy(24)) == want
    s = engine.scheduler
    assert s.spec_num_draft_tokens >= 20 * k, s.spec_num_draft_tokens
    rate = s.spec_num_accepted_tokens / s.spec_num_draft_tokens
    assert rate >= 0.9, f"k={k}: {s.spec_num_accepted_tokens} of {s.spec_num_draft_tokens} proposals accepted"



@pytest.mark.parametrize("case", ["eagle-copied", "eagle3-qwen3"])
def test_tensor_parallel_equal_to_one_rank(drafted, copied, case, single_torch_thread):
    """Two ranks (gloo): the drafts' attention heads and MLP split, the shared embedding
    and LM head split over the vocabulary, EAGLE-3's states whole on every rank; outputs
    equal the one-rank target's without speculation (and the copying draft is still
    accepted)."""
    from core_runner import LLM

    ckpt, path = copied if case == "eagle-copied" else drafted["qwen3", "eagle3"]
    method = case.split("-")[0]
    prompts = random_prompts([5, 17, 9], seed=31, vocab=ckpt.vocab)
    params = [greedy(16), sampled(16, seed=5, temperature=0.8, top_p=0.9), greedy(16)]
    want = all_tokens(make_engine(ckpt), prompts, params)
    llm = LLM(ckpt.path, tensor_parallel_size=2, speculative_config=spec(method, 3, path), device="cpu",
              dtype="float32", max_model_len=128, block_size=4, max_num_seqs=4, max_num_batched_tokens=16,
              num_kv_blocks=128)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.engine.shutdown()
    assert {str(i): list(o.outputs[0].token_ids) for i, o in enumerate(outs)} == want
    assert all(o.num_draft_tokens > 0 for o in outs)
    if case == "eagle-copied":  # the greedy requests: the sampled one keeps fewer greedy proposals
        drafted_n, accepted = (sum(getattr(outs[i], a) for i in (0, 2)) for a in ("num_draft_tokens",
                                                                                  "num_accepted_tokens"))
        assert accepted >= 0.9 * drafted_n, (accepted, drafted_n)


# ---------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------
class TargetWithoutAux(torch.nn.Module):
    """A target that returns its final hidden states only (no set_aux_hidden_state_layers)."""

    def __init__(self, target: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.lm_head = target.model, target.lm_head


def test_eagle3_needs_a_target_with_aux_hidden_states(registry, untied, tmp_path):
    target, tcfg = core_model(registry, untied)
    path = write_eagle3(tmp_path / "d", untied.vocab, draft_vocab=64, seed=2, layer_ids=[0, 1, 1])
    with pytest.raises(ValueError, match=r"method 'eagle3': the draft reads the target's hidden states at layers "
                                         r"\[0, 1, 1\], but TargetWithoutAux has no set_aux_hidden_state_layers"):
        load_draft(registry, "eagle3", path, TargetWithoutAux(target), tcfg)


def test_eagle3_layers_outside_the_target_are_named(registry, untied, tmp_path):
    target, tcfg = core_model(registry, untied)
    path = write_eagle3(tmp_path / "d", untied.vocab, draft_vocab=64, seed=2, layer_ids=None)  # (2, 1, -1)
    with pytest.raises(ValueError, match=r"aux hidden state layers \[-1, 1, 2\]: \[-1, 2\] are not layers of a "
                                         r"model with num_hidden_layers=2"):
        load_draft(registry, "eagle3", path, target, tcfg)


def test_unknown_draft_architecture_names_the_registered_ones(untied, tmp_path):
    from core_runner import LLM

    path = write_eagle(tmp_path / "d", untied.vocab, seed=3, arch="MysteryDraftForCausalLM")
    with pytest.raises(ValueError, match=r"no 'eagle' draft model is registered for the draft checkpoint's "
                                         r"architecture 'MysteryDraftForCausalLM': installed plugins register draft "
                                         r"models for \[.*'EagleLlamaForCausalLM \(eagle\)'.*'LlamaForCausalLMEagle3 "
                                         r"\(eagle3\)'"):
        LLM(untied.path, device="cpu", dtype="float32",
            speculative_config={"method": "eagle", "num_speculative_tokens": 2, "model": path})


def test_draft_checkpoints_that_cannot_fit_are_named(registry, untied, tmp_path):
    from safetensors.torch import load_file, save_file

    target, tcfg = core_model(registry, untied)
    # an EAGLE-3 draft vocabulary smaller than the target's needs its d2t table
    path = write_eagle3(tmp_path / "v", untied.vocab, draft_vocab=64, seed=2, layer_ids=[0, 1, 1])
    tensors = load_file(f"{path}/model.safetensors")
    del tensors["d2t"]
    save_file(tensors, f"{path}/model.safetensors")
    with pytest.raises(ValueError, match=r"draft_vocab_size=64 differs from the target's vocab_size=256 but the "
                                         r"checkpoint has no d2t table"):
        load_draft(registry, "eagle3", path, target, tcfg)
    # an EAGLE draft reads the target's hidden states as they are
    path = write_eagle(tmp_path / "h", untied.vocab, seed=3)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    (tmp_path / "h" / "config.json").write_text(json.dumps({**cfg, "hidden_size": 32}))
    with pytest.raises(ValueError, match=r"eagle draft: hidden_size=32 differs from the target's 64"):
        load_draft(registry, "eagle", path, target, tcfg)
