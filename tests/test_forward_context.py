"""The forward context is per thread: two engines stepping at once on two threads (two
servers in one process, an engine thread beside an offline engine) each get their own
step's metadata, so both give the outputs they give alone."""
from __future__ import annotations

import threading

import pytest
from helpers import build_checkpoint, random_prompts

from core_runner import LLM, SamplingParams


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("fctx")
    return build_checkpoint(root, "untied"), build_checkpoint(root, "tied")


def test_two_engines_on_two_threads_do_not_share_a_context(ckpts):
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    opts = dict(device="cpu", dtype="float32", max_model_len=96, max_num_seqs=4, num_kv_blocks=128,
                max_num_batched_tokens=8)
    llms = [LLM(c.path, **opts) for c in ckpts]
    prompts = [random_prompts([30, 11, 19], seed=s) for s in (1, 2)]
    alone = [[o.outputs[0].token_ids for o in llm.generate(p, params, use_tqdm=False)]
             for llm, p in zip(llms, prompts)]
    together: list = [None, None]
    errors: list = []
    start = threading.Barrier(2)

    def work(i: int) -> None:
        try:
            start.wait()
            for _ in range(3):
                together[i] = [o.outputs[0].token_ids for o in llms[i].generate(prompts[i], params, use_tqdm=False)]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert together == alone
