"""Structured outputs with a draft model (method "eagle", the third-party TinyDraft of
``spec_draft_fixture``): an attention-free random target with the demo model's shape and
tokenizer, and a draft that copies it (it proposes exactly the target's next greedy token).
Constrained outputs validate and equal those without speculation; where the grammar admits
the target's own greedy tokens, the draft's proposals reach the host and are kept."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import drain
from spec_draft_fixture import plugins_with_draft, write_copying_pair

from core_runner import SamplingParams
from core_runner.config import EngineConfig
from core_runner.demo import demo_checkpoint
from core_runner.engine.llm_engine import LLMEngine

SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "vocab_size", "max_position_embeddings", "rms_norm_eps", "eos_token_id", "bos_token_id")
CHOICES = ["red red red", "green green green"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    demo = Path(demo_checkpoint())
    cfg = {k: v for k, v in json.loads((demo / "config.json").read_text()).items() if k in SHAPE_KEYS}
    cfg.update(num_hidden_layers=2, tie_word_embeddings=False)
    target, draft = write_copying_pair(tmp_path_factory.mktemp("structured_draft"), cfg)
    for f in ("tokenizer.json", "tokenizer_config.json"):  # xgrammar needs the vocabulary
        shutil.copy(demo / f, Path(target) / f)
    return target, draft, plugins_with_draft()


def _engine(pair, draft: bool, async_scheduling: bool) -> LLMEngine:
    target, path, pm = pair
    opts = dict(model=target, dtype="float32", device="cpu", max_model_len=128, max_num_seqs=8, num_kv_blocks=200,
                async_scheduling=async_scheduling)
    if draft:
        opts["speculative_config"] = {"method": "eagle", "num_speculative_tokens": 3, "model": path}
    return LLMEngine(EngineConfig(**opts), pm)


def _run(eng: LLMEngine, prompts: list[str], params: list[SamplingParams]) -> list:
    for i, (p, sp) in enumerate(zip(prompts, params)):
        eng.add_request(p, sp, req_id=str(i))
    for i in range(len(prompts)):  # the grammars compile off the engine thread; wait, so that no step is empty
        g = eng.scheduler.requests[str(i)].structured_output
        if g is not None:
            g.future.result()
    done = drain(eng)
    return [done[str(i)] for i in range(len(prompts))]


def _tokens(outs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_draft_outputs_validate_equal_and_keep_proposals(pair, async_scheduling):
    prompt = "Once"
    free = _run(_engine(pair, False, async_scheduling), [prompt], [SamplingParams(max_tokens=8, temperature=0.0)])
    # a choice spelled by the target's own first greedy tokens: the masks admit the draft's proposals
    own = " ".join(free[0].outputs[0].text.split(" ")[:4])
    assert own.strip() and "\ufffd" not in own
    schema = {"type": "object", "properties": {"size": {"enum": ["s", "m", "l"]}, "ok": {"type": "boolean"}},
              "required": ["size", "ok"]}
    params = [
        SamplingParams(max_tokens=12, temperature=0.0, structured_outputs={"choice": [own, own + " more"]}),
        SamplingParams(max_tokens=40, temperature=0.0, structured_outputs={"json": schema,
                                                                           "disable_any_whitespace": True}),
        SamplingParams(max_tokens=20, temperature=0.0, structured_outputs={"regex": r"(ab|cd){2,6}x"}),
        SamplingParams(max_tokens=20, temperature=0.9, seed=5, structured_outputs={"choice": CHOICES}),
    ]
    prompts = [prompt, "The cat", "abab", "red"]
    want = _run(_engine(pair, False, async_scheduling), prompts, params)
    got = _run(_engine(pair, True, async_scheduling), prompts, params)
    assert _tokens(got) == _tokens(want)
    assert got[0].outputs[0].text in (own, own + " more")
    v = json.loads(got[1].outputs[0].text)
    assert set(v) == {"size", "ok"} and v["size"] in ("s", "m", "l") and isinstance(v["ok"], bool)
    assert re.fullmatch(r"(ab|cd){2,6}x", got[2].outputs[0].text)
    assert got[3].outputs[0].text in CHOICES
    assert all(o.outputs[0].finish_reason == "stop" and o.num_draft_tokens > 0 for o in got)
    assert got[0].num_accepted_tokens > 0  # the draft's proposals were walked by the grammar and kept
