"""The offline API in vLLM's shape: RequestOutput / CompletionOutput / Logprob, prompt
forms, SamplingParams.n and vLLM's other names, LLM.chat through a chat template, the
progress bar, and vLLM's engine-argument names.

The checkpoint is a tiny random Qwen3 with the byte-level tokenizer of test_sampler_stop
(one token per printable ASCII byte plus EOS) and a chat template in tokenizer_config.json.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_sampler_stop import EOS, byte_tokenizer

from core_runner import LLM, EngineConfig, SamplingParams
from core_runner.engine.outputs import CompletionOutput, Logprob, RequestOutput

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
OPTS = dict(dtype="float32", max_model_len=64, max_num_seqs=4, block_size=8, num_kv_blocks=64)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, single_torch_thread):
    import transformers

    path = tmp_path_factory.mktemp("vllm_api_ckpt")
    tok = byte_tokenizer(range(0x20, 0x7F))
    tok.save(str(path / "tokenizer.json"))
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "clean_up_tokenization_spaces": False}
    (path / "tokenizer_config.json").write_text(json.dumps({**tok_cfg, "chat_template": TEMPLATE}))
    # the same tokenizer without a chat template, for LLM(tokenizer=...)
    bare = tmp_path_factory.mktemp("vllm_api_bare_tokenizer")
    shutil.copy(path / "tokenizer.json", bare / "tokenizer.json")
    (bare / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    cfg = transformers.Qwen3Config(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        initializer_range=0.15, eos_token_id=tok.token_to_id(EOS), bos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path, bare


@pytest.fixture(scope="module")
def llm(ckpt):
    return LLM(str(ckpt[0]), **OPTS)


def greedy(n=6, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


def test_request_output_has_vllms_fields(llm):
    out = llm.generate("Hello there", greedy(5), use_tqdm=False)[0]
    assert isinstance(out, RequestOutput) and out.finished and out.prompt == "Hello there"
    assert out.prompt_token_ids == llm.tokenizer.encode("Hello there") and out.num_cached_tokens == 0
    assert out.prompt_logprobs is None and isinstance(out.request_id, str)
    (c,) = out.outputs
    assert isinstance(c, CompletionOutput) and c.index == 0 and c.finished()
    assert len(c.token_ids) == 5 and c.finish_reason == "length" and c.stop_reason is None
    assert c.text == llm.tokenizer.decode(c.token_ids) and c.logprobs is None and c.cumulative_logprob is None
    # core-runner's flat names read outputs[0]
    assert (out.token_ids, out.text, out.finish_reason, out.req_id) == (c.token_ids, c.text, "length", out.request_id)


def test_prompt_forms(llm):
    text = "The city is"
    ids = llm.tokenizer.encode(text)
    outs = llm.generate([text, {"prompt": text}, {"prompt_token_ids": ids}, ids], greedy(), use_tqdm=False)
    assert len({tuple(o.token_ids) for o in outs}) == 1
    assert [o.prompt for o in outs] == [text, text, None, None]
    assert all(o.prompt_token_ids == ids for o in outs)
    single = llm.generate({"prompt_token_ids": ids}, greedy(), use_tqdm=False)
    assert len(single) == 1 and single[0].token_ids == outs[0].token_ids
    with pytest.raises(ValueError, match=r"prompt 1: a dict prompt with keys \['text'\] is not accepted"):
        llm.generate([text, {"text": text}], greedy(), use_tqdm=False)
    with pytest.raises(ValueError, match="prompt 0: a prompt of type float 3.5 is not accepted"):
        llm.generate([3.5], greedy(), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_n_samples_are_seeded_requests(llm):
    sp = SamplingParams(max_tokens=8, temperature=1.0, seed=40, n=3, ignore_eos=True)
    out = llm.generate("Once upon", sp, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2] and out.finished
    alone = [llm.generate("Once upon", SamplingParams(max_tokens=8, temperature=1.0, seed=40 + i, ignore_eos=True),
                          use_tqdm=False)[0].token_ids for i in range(3)]
    assert [c.token_ids for c in out.outputs] == alone
    assert len({tuple(t) for t in alone}) > 1, "different seeds should give different samples here"
    # unseeded: n samples of one prompt, each its own draw; mixed with an n=1 prompt
    outs = llm.generate(["Once upon", "A"], [SamplingParams(max_tokens=8, n=4, ignore_eos=True), greedy()],
                        use_tqdm=False)
    assert len(outs[0].outputs) == 4 and len(outs[1].outputs) == 1
    assert len({tuple(c.token_ids) for c in outs[0].outputs}) > 1
    assert outs[0].request_id != outs[1].request_id
    with pytest.raises(ValueError, match=r"SamplingParams\.n=2 is invalid here"):
        llm.engine.add_request("x", SamplingParams(n=2))
    with pytest.raises(ValueError, match=r"SamplingParams\.n=0 is invalid"):
        SamplingParams(n=0)


def test_vllm_defaults_for_max_tokens_and_top_k(llm):
    ids = llm.tokenizer.encode("Hi")
    out = llm.generate(ids, SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.token_ids) == OPTS["max_model_len"] - len(ids) and out.finish_reason == "length"
    assert SamplingParams(top_k=0).top_k == -1
    a, b = (llm.generate("Hi", SamplingParams(max_tokens=8, seed=3, top_k=k), use_tqdm=False)[0].token_ids
            for k in (0, -1))
    assert a == b
    for bad, field in ((dict(max_tokens=0), "max_tokens"), (dict(top_k=-2), "top_k"),
                       (dict(skip_special_tokens=1), "skip_special_tokens"),
                       (dict(spaces_between_special_tokens=False), "spaces_between_special_tokens")):
        with pytest.raises(ValueError, match=rf"SamplingParams\.{field}="):
            SamplingParams(**bad)


def test_stop_string_kept_with_include_stop_str(llm):
    plain = llm.generate("The weather", greedy(12), use_tqdm=False)[0].text
    stop = plain[4:6]
    assert stop and plain.find(stop) == 4, plain
    cut, kept = (llm.generate("The weather", greedy(12, stop=[stop], include_stop_str_in_output=flag),
                              use_tqdm=False)[0] for flag in (False, True))
    assert cut.text == plain[:4] and kept.text == plain[:6]
    assert cut.stop_reason == kept.stop_reason == stop and kept.finish_reason == "stop"


def test_skip_special_tokens(llm):
    eos = llm.tokenizer.convert_tokens_to_ids(EOS)
    sp = dict(max_tokens=3, temperature=0.0, ignore_eos=True, logit_bias={eos: 100.0})
    skipped = llm.generate("Hi", SamplingParams(**sp), use_tqdm=False)[0]
    kept = llm.generate("Hi", SamplingParams(**sp, skip_special_tokens=False), use_tqdm=False)[0]
    assert skipped.token_ids == kept.token_ids == [eos] * 3
    assert skipped.text == "" and kept.text == EOS * 3
    with_stop = llm.generate("Hi", SamplingParams(**sp, skip_special_tokens=False, stop=["zzz"]), use_tqdm=False)[0]
    assert with_stop.text == EOS * 3  # the incremental detokenizer honours it too


def test_logprobs_are_logprob_records(llm):
    out = llm.generate("Good", greedy(4, logprobs=2, prompt_logprobs=1), use_tqdm=False)[0]
    c = out.outputs[0]
    assert len(c.logprobs) == 4
    for tok, entry in zip(c.token_ids, c.logprobs):
        assert all(isinstance(v, Logprob) for v in entry.values()) and tok in entry
        assert entry[tok].rank == 1  # greedy, raw distribution, no penalties
        assert sorted(v.rank for v in entry.values()) == [1, 2]
        assert all(v.decoded_token == llm.tokenizer.decode([t]) for t, v in entry.items())
    assert c.cumulative_logprob == pytest.approx(sum(d[t].logprob for d, t in zip(c.logprobs, c.token_ids)))
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(out.prompt_token_ids)
    for tok, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
        assert tok in entry and entry[tok].logprob <= 0.0
        top = min(entry.values(), key=lambda v: v.rank or 99)
        assert top.rank == 1 and top.logprob == max(v.logprob for v in entry.values())


def test_chat_uses_the_tokenizers_template(llm, ckpt):
    conv = [{"role": "user", "content": "Hi"}]
    out = llm.chat(conv, greedy(), use_tqdm=False)[0]
    assert out.prompt == "<user>Hi\n<assistant>"
    assert out.prompt_token_ids == llm.tokenizer.encode(out.prompt, add_special_tokens=False)
    assert out.token_ids == llm.generate(out.prompt_token_ids, greedy(), use_tqdm=False)[0].token_ids
    two = llm.chat([conv, conv + [{"role": "assistant", "content": "Yo"}]], greedy(), use_tqdm=False,
                   add_generation_prompt=False)
    assert [o.prompt for o in two] == ["<user>Hi\n", "<user>Hi\n<assistant>Yo\n"]
    bare = LLM(str(ckpt[0]), tokenizer=str(ckpt[1]), **OPTS)
    with pytest.raises(ValueError, match="has no chat template.*chat_template="):
        bare.chat(conv, greedy(), use_tqdm=False)
    own = bare.chat(conv, greedy(), use_tqdm=False, chat_template="{{ messages[0]['content'] }}!")[0]
    assert own.prompt == "Hi!"
    with pytest.raises(ValueError, match="conversation 0: the chat template failed"):
        bare.chat(conv, greedy(), use_tqdm=False, chat_template="{{ messages[0]['content'] + 1 }}")


def test_progress_bar_by_default(llm, capsys):
    llm.generate(["a", "b"], greedy(2))
    assert "Processed prompts" in capsys.readouterr().err
    llm.generate(["a", "b"], greedy(2), use_tqdm=False)
    assert "Processed prompts" not in capsys.readouterr().err


@pytest.mark.parametrize("field,value", [("tensor_parallel_size", 0), ("pipeline_parallel_size", 4),
                                         ("trust_remote_code", True)])
def test_vllm_engine_arguments(field, value):
    base = EngineConfig(model="x", device="cpu", tensor_parallel_size=1, pipeline_parallel_size=1,
                        trust_remote_code=False)
    assert (base.tensor_parallel_size, base.pipeline_parallel_size, base.trust_remote_code) == (1, 1, False)
    with pytest.raises(ValueError, match=rf"{field}={value!r} is invalid"):
        EngineConfig(model="x", device="cpu", **{field: value})
