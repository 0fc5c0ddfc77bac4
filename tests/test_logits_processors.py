"""Logits-processor plugins: one registered by entry point from a package outside core_runner
(tests/fixtures_lp) and one passed as LLM(logits_processors=["module:Class"]); per-request
arguments through SamplingParams.extra_args; rows without arguments get the tokens they get
without the processor, in any batch (batch invariance); bad specs refused by name."""
from __future__ import annotations

import sys

import pytest
from serving_helpers import LP_FIXTURES as FIXTURES
from serving_helpers import lp_entry_point

from core_runner import LLM, SamplingParams
from core_runner.demo import demo_checkpoint
from core_runner.logits_processor import installed_processors

OPTS = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=8, num_kv_blocks=64)


@pytest.fixture(scope="module")
def plain():
    return LLM(demo_checkpoint(), **OPTS)  # built before the entry point exists: no processor


@pytest.fixture(scope="module")
def by_entry_point(tmp_path_factory):
    with lp_entry_point(tmp_path_factory.mktemp("lpdist")):
        assert [c.__name__ for c in installed_processors()] == ["TargetTokenProcessor"]
        yield LLM(demo_checkpoint(), **OPTS)


def test_entry_point_processor_reads_extra_args_and_leaves_other_rows(plain, by_entry_point):
    llm = by_entry_point
    assert llm.engine.runner.sampling.plugins.processors and not plain.engine.runner.sampling.plugins.processors
    forced = SamplingParams(max_tokens=6, temperature=0.8, seed=1, extra_args={"target_token": 42}, ignore_eos=True)
    free = [SamplingParams(max_tokens=8, temperature=0.8, seed=s) for s in (2, 3)]
    prompts = ["The cat", "Once upon", "A dog"]
    outs = llm.generate(prompts, [free[0], forced, free[1]], use_tqdm=False)
    assert outs[1].outputs[0].token_ids == [42] * 6
    ref = plain.generate([prompts[0], prompts[2]], free, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in (outs[0], outs[2])] == [o.outputs[0].token_ids for o in ref]
    alone = llm.generate([prompts[2]], [free[1]], use_tqdm=False)  # batch invariance with the processor
    assert alone[0].outputs[0].token_ids == outs[2].outputs[0].token_ids


def test_processor_by_name_and_refusals():
    sys.path.insert(0, str(FIXTURES))
    try:
        llm = LLM(demo_checkpoint(), logits_processors=["cr_lp_fixture:TargetTokenProcessor"], **OPTS)
        out = llm.generate(["x"], SamplingParams(max_tokens=3, extra_args={"target_token": 7}, ignore_eos=True),
                           use_tqdm=False)
        assert out[0].outputs[0].token_ids == [7, 7, 7]
    finally:
        sys.path.remove(str(FIXTURES))
    with pytest.raises(ValueError, match="module:Class"):
        LLM(demo_checkpoint(), logits_processors=["nocolon"], **OPTS)
    with pytest.raises(ValueError, match="not a subclass"):
        LLM(demo_checkpoint(), logits_processors=[int], **OPTS)
    with pytest.raises(ValueError, match="extra_args"):
        SamplingParams(extra_args=[1])
