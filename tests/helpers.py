"""Shared utilities for the engine-vs-transformers tests.

Tiny random Qwen3 checkpoints, Hugging Face references (computed one prompt at a
time, batch 1, explicit all-ones attention mask), an engine factory, a recorder of
every real step (the conformance suite's, over ``engine.debug``), and helpers to
snapshot / corrupt the runner's persistent per-row state.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

# the step recorder and the persistent-state tools (snapshots, diffs, garbage) are the
# conformance suite's own
from core_runner.conformance.harness import Recorder as SuiteRecorder
from core_runner.conformance.state_tools import (  # noqa: F401  (re-exported under the tests' names)
    fill_free_blocks_with_garbage as fill_free_kv_blocks_with_garbage,
)
from core_runner.conformance.state_tools import fill_garbage as fill_garbage
from core_runner.conformance.state_tools import free_block_ids as free_block_ids
from core_runner.conformance.state_tools import row_tables as device_tables  # noqa: F401
from core_runner.conformance.state_tools import snapshot as snapshot
from core_runner.conformance.state_tools import snapshot_diff as snapshot_diff

VOCAB = 256
TINY = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
    rms_norm_eps=1e-6,
    # wider than the default 0.02: with it the tied model's greedy output repeats one
    # token, the untied one has near-ties (top-2 logit gaps ~4e-5), and top_p=0.9 cuts
    # almost nothing from the near-uniform distribution. At 0.15 greedy continuations
    # vary, argmax gaps are >= ~7e-4 and the nucleus cut changes sampled tokens.
    initializer_range=0.15,
    # no special ids: neither HF generate nor the engine may stop early on an EOS
    eos_token_id=None, bos_token_id=None, pad_token_id=None,
)
CHECKPOINT_SPECS = {
    "untied": dict(tie_word_embeddings=False, num_key_value_heads=2, seed=0),
    "tied": dict(tie_word_embeddings=True, num_key_value_heads=4, seed=1),
}
REF_TOKENS = 16  # HF greedy continuations are computed this long once and sliced


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------
# checkpoints and Hugging Face references
# ---------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    name: str
    path: str
    hf: Any  # transformers.Qwen3ForCausalLM, float32, eval
    vocab: int = VOCAB
    _greedy: dict = field(default_factory=dict, repr=False)
    _logits: dict = field(default_factory=dict, repr=False)


def build_checkpoint(root: Path, name: str) -> Checkpoint:
    import transformers

    spec = dict(CHECKPOINT_SPECS[name])
    seed = spec.pop("seed")
    cfg = transformers.Qwen3Config(**{**TINY, **spec})
    torch.manual_seed(seed)
    hf = transformers.Qwen3ForCausalLM(cfg).to(torch.float32).eval()
    tied = hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    assert tied == spec["tie_word_embeddings"], f"{name}: HF model tying is {tied}, wanted {spec}"
    path = Path(root) / name
    hf.save_pretrained(str(path))
    return Checkpoint(name=name, path=str(path), hf=hf)


def build_checkpoints(root: Path) -> dict[str, Checkpoint]:
    return {name: build_checkpoint(root, name) for name in CHECKPOINT_SPECS}


def random_prompts(lengths: list[int], seed: int, vocab: int = VOCAB) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def hf_greedy(ckpt: Checkpoint, prompt: list[int], n: int) -> list[int]:
    """HF greedy continuation of one prompt (batch 1), n <= REF_TOKENS tokens."""
    assert n <= REF_TOKENS
    key = tuple(prompt)
    if key not in ckpt._greedy:
        ids = torch.tensor([prompt], dtype=torch.long)
        with torch.no_grad():
            out = ckpt.hf.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=REF_TOKENS, do_sample=False,
                eos_token_id=None, pad_token_id=0,
            )
        new = out[0, len(prompt):].tolist()
        assert len(new) == REF_TOKENS, f"HF generate stopped early ({len(new)} tokens): EOS leaked in"
        ckpt._greedy[key] = new
    return ckpt._greedy[key][:n]


def hf_logits(ckpt: Checkpoint, seq: list[int]) -> torch.Tensor:
    """HF full-forward logits [len(seq), vocab] (row i predicts token i + 1)."""
    key = tuple(seq)
    if key not in ckpt._logits:
        ids = torch.tensor([seq], dtype=torch.long)
        with torch.no_grad():
            ckpt._logits[key] = ckpt.hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    return ckpt._logits[key]


# ---------------------------------------------------------------------------------
# engine construction and driving
# ---------------------------------------------------------------------------------
def make_engine(ckpt: Checkpoint, **overrides: Any):
    """An LLMEngine (through the public LLM) with small defaults; the KV pool holds
    max_num_seqs full-length requests unless num_kv_blocks is given."""
    from core_runner import LLM

    opts: dict[str, Any] = dict(dtype="float32", device="cpu", max_model_len=128, max_num_seqs=8, block_size=4)
    opts.update(overrides)
    if opts.get("num_kv_blocks") is None:
        opts["num_kv_blocks"] = opts["max_num_seqs"] * cdiv(opts["max_model_len"], opts["block_size"])
    return LLM(ckpt.path, **opts).engine


def greedy(n: int = 12):
    from core_runner import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def sampled(n: int = 12, seed: int | None = 1234, temperature: float = 0.8, top_p: float = 0.9, top_k: int = -1):
    from core_runner import SamplingParams

    return SamplingParams(max_tokens=n, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                          ignore_eos=True)


class Recorder(SuiteRecorder):
    """The conformance suite's step recorder over ``engine.debug.record_steps()``, strict:
    during each step it asserts that a real step produced its logits once, shaped
    [num_reqs, vocab], for exactly the scheduled requests (and an empty step none)."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine, strict=True)


def step_until(engine: Any, outputs: dict, cond: Callable[[], bool], max_steps: int = 2000) -> None:
    """Step until cond() holds (checked before each step); finished outputs go to ``outputs``."""
    for _ in range(max_steps):
        if cond():
            return
        assert engine.has_unfinished_requests(), "no unfinished requests left but the condition never held"
        for o in engine.step():
            assert o.req_id not in outputs, f"request {o.req_id} finished twice"
            outputs[o.req_id] = o
    raise AssertionError(f"condition not reached within {max_steps} steps")


def drain(engine: Any, outputs: dict | None = None, max_steps: int = 2000) -> dict:
    outputs = {} if outputs is None else outputs
    step_until(engine, outputs, lambda: not engine.has_unfinished_requests(), max_steps)
    return outputs


def run(engine: Any, requests: list[tuple[str, list[int], Any]], max_steps: int = 2000) -> dict:
    """Add (req_id, prompt, params) in order and run to completion."""
    for req_id, prompt, params in requests:
        assert engine.add_request(prompt, params, req_id=req_id) == req_id
    return drain(engine, max_steps=max_steps)


def assert_logits_match_hf(ckpt: Checkpoint, rec: Recorder, outputs: dict, atol: float = 1e-4) -> int:
    """Every recorded logits row (prefill chunk ends, full prefills and decodes) equals
    the HF full-forward logits at the same position of prompt + output. Returns the
    number of rows checked."""
    checked = 0
    for req_id, out in outputs.items():
        seq = list(out.prompt_token_ids) + list(out.token_ids)
        ref = hf_logits(ckpt, seq[:-1])
        entries = rec.logits_of(req_id)
        assert entries, f"no logits recorded for {req_id}"
        positions = {p for p, _ in entries}
        # every generated token must have come from a recorded logits row
        wanted = set(range(len(out.prompt_token_ids) - 1, len(seq) - 1))
        assert wanted <= positions, f"{req_id}: missing logits at positions {sorted(wanted - positions)}"
        for pos, lg in entries:
            err = (lg - ref[pos]).abs().max().item()
            assert err <= atol, f"{ckpt.name} {req_id}: logits at position {pos} differ from HF by {err:.3g}"
            checked += 1
    return checked



def read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory's safetensors files, by name."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def step_without_host_sync(eng: Any, watch: Callable[[Any, bool], None] | None = None,
                           max_steps: int = 2000) -> tuple[int, int]:
    """Step ``eng``'s scheduler and runner as EngineCore does (the next step planned while
    the previous one is in flight), every ``execute_model`` under
    ``torch.cuda.set_sync_debug_mode("error")``, until all requests finish.
    ``watch(out, in_flight)`` sees each planned step and whether one was in flight.
    Returns (steps, requests finished)."""
    steps, in_flight, done = 0, [], 0
    while eng.scheduler.has_unfinished() or in_flight:
        out = eng.scheduler.schedule()
        if watch is not None:
            watch(out, bool(in_flight))
        torch.cuda.set_sync_debug_mode("error")
        try:
            handle = eng.runner.execute_model(out)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        if not out.is_empty:
            in_flight.append((out, handle))
        while in_flight and (len(in_flight) > 1 or out.is_empty):
            o, h = in_flight.pop(0)
            done += len(eng.scheduler.update_from_output(o, h.get()))
        steps += 1
        assert steps < max_steps, "the step loop does not terminate"
    return steps, done


def fake_plugin_dist(root: Path, ep_name: str, module_name: str, module_src: str) -> None:
    """An installed-looking distribution ``fake-<ep_name>`` in ``root`` (put ``root`` on
    sys.path) whose ``core_runner`` entry point ``ep_name`` is ``module_name``, written from
    ``module_src``."""
    (root / f"{module_name}.py").write_text(module_src)
    dist = root / f"fake_{ep_name}-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fake-{ep_name}\nVersion: 0.0.1\n")
    (dist / "entry_points.txt").write_text(f"[core_runner]\n{ep_name} = {module_name}\n")
