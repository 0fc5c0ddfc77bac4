"""Bad input gets a clear error naming the value, and harms no other request."""
from __future__ import annotations

import json

import pytest
import torch
import transformers

from core_runner import LLM, EngineConfig, SamplingParams


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("badinput")
    cfg = transformers.Qwen3Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture()
def llm(tiny_ckpt):
    return LLM(tiny_ckpt, dtype="float32", max_model_len=32, max_num_seqs=4, block_size=4, num_kv_blocks=32)


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.5}, r"temperature=-0.5 is invalid: expected a finite number >= 0"),
    ({"top_p": 0.0}, r"top_p=0.0 is invalid: expected a number in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p=1.5 is invalid"),
    ({"top_k": -2}, r"top_k=-2 is invalid: expected 0 or -1 \(disabled\) or an integer in \[1, "),
    ({"max_tokens": 0}, r"max_tokens=0 is invalid"),
    ({"seed": -1}, r"seed=-1 is invalid"),
    ({"stop_token_ids": [-3]}, r"stop_token_ids"),
    # ranges of the device tables the values are staged into
    ({"top_k": 2**31}, r"top_k=2147483648 is invalid: expected 0 or -1 \(disabled\) or an integer in \[1, 2147483647"),
    ({"top_k": True}, r"top_k=True is invalid"),
    ({"seed": 2**63}, r"seed=9223372036854775808 is invalid: expected None or an integer in \[0, 2\*\*63\)"),
    ({"stop_token_ids": [2**63], "min_tokens": 2}, r"stop_token_ids=\[9223372036854775808\] is invalid: .*2\*\*63"),
    ({"logit_bias": {2**64: 1.0}}, r"logit_bias=.* invalid: token id 18446744073709551616 is outside \[0, 2\*\*63\)"),
    ({"temperature": 1e39}, r"temperature=1e\+39 is invalid: expected a finite number >= 0"),
    # non-finite values (temperature=inf used to act as greedy)
    ({"temperature": float("inf")}, r"temperature=inf is invalid: expected a finite number >= 0"),
    ({"temperature": float("nan")}, r"temperature=nan is invalid"),
    ({"top_p": float("nan")}, r"top_p=nan is invalid"),
    ({"min_p": float("nan")}, r"min_p=nan is invalid"),
    ({"repetition_penalty": float("nan")}, r"repetition_penalty=nan is invalid"),
    ({"repetition_penalty": float("inf")}, r"repetition_penalty=inf is invalid"),
    ({"frequency_penalty": float("nan")}, r"frequency_penalty=nan is invalid"),
    ({"presence_penalty": float("-inf")}, r"presence_penalty=-inf is invalid"),
    ({"logit_bias": {3: float("nan")}}, r"logit_bias=.* is invalid: bias nan of token 3"),
    # logit_bias keys are token ids: ints, or strings of decimal digits (JSON object keys)
    ({"logit_bias": {1.7: 1.0}}, r"logit_bias=\{1.7: 1.0\} is invalid: token id 1.7 is not an integer: expected int "
                                 r"keys, or strings of decimal digits"),
    ({"logit_bias": {2.0: 1.0}}, r"token id 2.0 is not an integer"),
    ({"logit_bias": {True: 1.0}}, r"token id True is not an integer"),
    ({"logit_bias": {" 7 ": 1.0}}, r"token id ' 7 ' is not an integer"),
    ({"logit_bias": {"1_0": 1.0}}, r"token id '1_0' is not an integer"),
    ({"logit_bias": {"-1": 1.0}}, r"token id '-1' is not an integer"),
    ({"logit_bias": {"\u0663": 1.0}}, r"token id '\u0663' is not an integer"),  # an Arabic-Indic digit
    ({"logit_bias": {"7": 1.0, 7: 2.0}}, r"token id 7 is given twice"),
])
def test_invalid_sampling_params_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"dtype": "fp8"}, r"dtype='fp8' is invalid"),
    ({"device": "tpu"}, r"device='tpu' is invalid"),
    ({"block_size": 0}, r"block_size=0 is invalid"),
    ({"block_size": 1 << 20, "max_model_len": 512},
     r"block_size=1048576 is invalid: expected at most max\(max_model_len=512, 16\) = 512"),
    ({"block_size": 32, "max_model_len": 8}, r"block_size=32 is invalid: expected at most .* = 16"),
    ({"max_num_batched_tokens": 0}, r"max_num_batched_tokens=0 is invalid"),
    ({"num_kv_blocks": 0}, r"num_kv_blocks=0 is invalid"),
    ({"max_cudagraph_capture_size": 0}, r"max_cudagraph_capture_size=0 is invalid: expected an integer >= 1"),
    ({"max_cudagraph_capture_size": 1.5}, r"max_cudagraph_capture_size=1.5 is invalid"),
    # every field against its annotation; bool is a subclass of int, and is refused for int fields
    ({"seed": "abc"}, r"seed='abc' is invalid: expected int, got str"),
    ({"num_kv_blocks": True}, r"num_kv_blocks=True is invalid: expected int or None, got bool"),
    ({"strict": "no"}, r"strict='no' is invalid: expected bool, got str"),
    ({"max_logprobs": True}, r"max_logprobs=True is invalid: expected int, got bool"),
    ({"max_model_len": 2048.0}, r"max_model_len=2048.0 is invalid: expected int, got float"),
    ({"enforce_eager": 1}, r"enforce_eager=1 is invalid: expected bool, got int"),
    ({"gpu_memory_utilization": "0.5"}, r"gpu_memory_utilization='0.5' is invalid: expected float or None, got str"),
    ({"device": "cudafoo"}, r"device='cudafoo' is invalid: expected 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ({"device": "cuda:-1"}, r"device='cuda:-1' is invalid"),
    ({"device": None}, r"device=None is invalid: expected str, got NoneType"),
])
def test_invalid_engine_options_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(model="x", **kwargs)


def test_engine_config_fields_take_their_annotated_types():
    from pathlib import Path

    cfg = EngineConfig(model=Path("/ckpt"), tokenizer=Path("/tok"), device="cpu", gpu_memory_utilization=1,
                       seed=3)
    assert (cfg.model, cfg.tokenizer, cfg.gpu_memory_utilization) == ("/ckpt", "/tok", 1)  # paths kept as str


def test_a_cuda_device_this_process_cannot_use_is_refused_by_name(tiny_ckpt, capsys):
    from core_runner.cli import main

    # on a machine without a GPU any CUDA name is refused; with one, an index past the last
    name = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    gpu = torch.cuda.is_available()
    why = r"CUDA device\(s\) visible" if gpu else r"(built without CUDA|no CUDA device is visible)"
    with pytest.raises(ValueError, match=rf"device='{name}' cannot be used: .*{why}"):
        LLM(tiny_ckpt, dtype="float32", device=name, max_model_len=32, num_kv_blocks=32)
    for device in (name, "cudafoo"):
        rc = main(["generate", "--model", tiny_ckpt, "--device", device, "--max-model-len", "16", "hello"])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith(f"core-runner: error: device='{device}'") and err.count("\n") == 1, err


def test_logit_bias_keys_read_as_token_ids():
    import numpy as np

    for key in (7, "7", np.int64(7)):
        assert SamplingParams(logit_bias={key: 1.5}).logit_bias == {7: 1.5}


def test_block_sizes_up_to_the_limit_are_accepted():
    assert EngineConfig(model="x", device="cpu", max_model_len=8).block_size == 16
    assert EngineConfig(model="x", device="cpu", max_model_len=48, block_size=48).block_size == 48  # any size


def test_pool_too_small_for_one_request(tiny_ckpt):
    with pytest.raises(ValueError, match=r"num_kv_blocks=2 cannot hold one request of max_model_len=32"):
        LLM(tiny_ckpt, dtype="float32", max_model_len=32, block_size=4, num_kv_blocks=2)


def test_max_model_len_beyond_model_positions(tiny_ckpt):
    with pytest.raises(ValueError, match=r"max_model_len=1000 exceeds .*max_position_embeddings=256"):
        LLM(tiny_ckpt, dtype="float32", max_model_len=1000, num_kv_blocks=300)


def test_prompt_too_long_and_empty_prompt(llm):
    with pytest.raises(ValueError, match=r"prompt 1: prompt has 32 tokens but max_model_len=32 allows at most 31"):
        llm.generate([[5] * 4, [5] * 32], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"prompt 0: prompt is empty"):
        llm.generate([[]], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"token id 500 is outside the vocabulary \[0, 128\)"):
        llm.generate([[1, 500]], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"no tokenizer: pass prompts as lists of token ids"):
        llm.generate(["text"], SamplingParams(max_tokens=2))
    # nothing was left queued by the rejected batches
    assert not llm.engine.has_unfinished_requests()


def test_prompt_of_max_model_len_minus_one_generates_one_token(llm):
    out = llm.generate([[7] * 31], SamplingParams(max_tokens=1, temperature=0.0))[0]
    assert len(out.token_ids) == 1 and out.finish_reason == "length"
    # the default max_tokens (16) is cut to what the context leaves; None means all of it
    for params in (SamplingParams(temperature=0.0), SamplingParams(max_tokens=None, temperature=0.0)):
        out = llm.generate([[7] * 31], params)[0]
        assert len(out.token_ids) == 1 and out.finish_reason == "length"


@pytest.mark.parametrize("max_tokens", [23, 10**12, 2**70])
def test_max_tokens_beyond_the_context_is_refused_naming_both_numbers(llm, max_tokens):
    with pytest.raises(ValueError, match=rf"prompt 1: SamplingParams.max_tokens={max_tokens} is too large: the prompt "
                                         r"has 10 tokens and max_model_len is 32, which leaves at most 22 "
                                         rf"\({max_tokens} > 32 - 10\)"):
        llm.generate([[5] * 4, [5] * 10], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=max_tokens)])
    with pytest.raises(ValueError, match=rf"max_tokens={max_tokens} is too large"):
        llm.engine.add_request([5] * 10, SamplingParams(max_tokens=max_tokens))
    assert not llm.engine.has_unfinished_requests()


def test_max_tokens_up_to_the_context_runs_and_defaults_stay_defaults(llm):
    import dataclasses

    from core_runner.engine.defaults import GenerationDefaults
    from core_runner.sampling_params import AtMost

    out = llm.generate([[5] * 10], SamplingParams(max_tokens=22, ignore_eos=True))[0]
    assert len(out.token_ids) == 22 and out.finish_reason == "length"
    default = SamplingParams(temperature=0.0)
    assert default.max_tokens == 16 and repr(default.max_tokens) == "16"
    assert isinstance(dataclasses.replace(default, top_k=3).max_tokens, AtMost)  # still a default
    assert not isinstance(dataclasses.replace(default, max_tokens=16).max_tokens, AtMost)  # asked for
    checkpoint = GenerationDefaults(sampling={"max_tokens": 4096}).sampling_params()  # generation_config.json's
    assert checkpoint.max_tokens == 4096 and isinstance(checkpoint.max_tokens, AtMost)
    out = llm.generate([[5] * 10], dataclasses.replace(checkpoint, ignore_eos=True))[0]
    assert len(out.token_ids) == 22 and out.finish_reason == "length"


def test_bad_request_does_not_harm_the_batch(llm):
    good = [[3, 4, 5, 6], [9] * 10]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    expected = [o.token_ids for o in llm.generate(good, params)]
    eng = llm.engine
    eng.add_request(good[0], params, req_id="g0")
    eng.step()  # g0 is running when the bad ones arrive
    for bad in ([1] * 40, [], [1, 999]):
        with pytest.raises(ValueError):
            eng.add_request(bad, params, req_id="bad")
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request(good[1], params, req_id="g0")
    eng.add_request(good[1], params, req_id="g1")
    done = {}
    while eng.has_unfinished_requests():
        done.update({o.req_id: o.token_ids for o in eng.step()})
    assert [done["g0"], done["g1"]] == expected


def test_sampling_params_count_must_match_prompts(llm):
    with pytest.raises(ValueError, match="got 3 SamplingParams for 2 prompts"):
        llm.generate([[1], [2]], [SamplingParams()] * 3)


def test_unknown_architecture_error(tmp_path, tiny_ckpt):
    with open(f"{tiny_ckpt}/config.json") as f:
        cfg = json.load(f)
    cfg["architectures"] = ["MadeUpForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"'MadeUpForCausalLM' is unknown: installed plugins provide \["):
        LLM(str(tmp_path))


def test_missing_checkpoint_dir():
    with pytest.raises(FileNotFoundError, match="no config.json there"):
        LLM("/nonexistent/checkpoint")


def test_cli_reports_errors_cleanly(tiny_ckpt, capsys):
    from core_runner.cli import main

    rc = main(["generate", "--model", tiny_ckpt, "--max-model-len", "16", "--num-kv-blocks", "8",
               "--temperature", "-1", "hello"])
    assert rc == 2
    assert "temperature=-1.0 is invalid" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, field", [
    ({"stop_token_ids": [128], "min_tokens": 2}, "stop_token_ids"),
    ({"stop_token_ids": [2**40]}, "stop_token_ids"),
    ({"logit_bias": {500: 1.0}}, "logit_bias"),
])
def test_token_ids_outside_the_vocabulary_are_refused_at_add_time(llm, kwargs, field):
    engine = llm.engine
    with pytest.raises(ValueError, match=rf"SamplingParams.{field} token id \d+ is invalid: expected ids in \[0, 128"):
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=4, **kwargs))
    assert not engine.has_unfinished_requests()
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0.0, min_tokens=2, stop_token_ids=[127]))
    assert out[0].finish_reason in ("length", "stop") and out[0].token_ids


@pytest.mark.parametrize("prompt, match", [
    (None, r"prompt 0: a prompt of type NoneType None is not accepted: expected a str, a list of int token ids"),
    ({"text": "hi"}, r"prompt 0: a dict prompt with keys \['text'\] is not accepted: expected a str"),
    ({"prompt": [1, 2]}, r"prompt 0: a dict prompt with keys \['prompt'\] is not accepted"),
    (b"\x01\x02", r"prompt 0: a prompt of type bytes .* is not accepted"),
    ([1.0, 2.0], r"prompt 0: a token-id prompt must be a list of ints, but element 0 is float 1.0"),
    ([[1, 2], [3]], r"prompt 0: a token-id prompt must be a list of ints, but element 0 is list \[1, 2\]"),
    ({"prompt_token_ids": (1, "a")}, r"prompt 0: the \"prompt_token_ids\" value must be a list of ints, but element 1"),
])
def test_prompts_of_the_wrong_type_name_the_index_and_the_accepted_forms(llm, prompt, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([prompt], SamplingParams(max_tokens=2))
    assert not llm.engine.has_unfinished_requests()


def test_a_lone_surrogate_is_refused_naming_the_prompt_and_the_character(llm):
    for prompt in ("a\ud800b", {"prompt": "a\udfffb"}):
        with pytest.raises(ValueError, match=r"prompt 1: a text prompt must be valid Unicode: character 1 is a lone "
                                             r"surrogate \(U\+D[8F]{1}[0F]{2}\)"):
            llm.generate([[5, 6], prompt], SamplingParams(max_tokens=2))
    assert not llm.engine.has_unfinished_requests()


def test_numpy_prompts_are_refused_not_read_as_token_ids(llm):
    import numpy as np

    with pytest.raises(ValueError, match=r"prompts of type ndarray are not accepted"):
        llm.generate(np.array([1, 2, 3]), SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"prompt 1: .*element 0 is int64 .*pass array.tolist"):
        llm.generate([[1, 2], list(np.array([1, 2]))], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"a prompt of type ndarray"):
        llm.engine.add_request(np.array([1, 2, 3]), SamplingParams(max_tokens=2))


def test_text_and_tokens_prompt_dicts_are_accepted(llm):
    sp = SamplingParams(max_tokens=3, temperature=0.0)
    ref = llm.generate([[5, 6, 7]], sp)[0].token_ids
    outs = llm.generate([{"prompt_token_ids": [5, 6, 7]}, [5, 6, 7]], sp)
    assert [o.token_ids for o in outs] == [ref, ref]
    assert llm.generate({"prompt_token_ids": [5, 6, 7]}, sp)[0].token_ids == ref
    rid = llm.engine.add_request({"prompt_token_ids": [5, 6, 7]}, sp, req_id="d")
    outs = {}
    while llm.engine.has_unfinished_requests():
        outs.update({o.req_id: o for o in llm.engine.step()})
    assert outs[rid].token_ids == ref


def test_parse_prompt_reads_the_text_prompt_dict():
    from core_runner.engine.input_processor import parse_prompt

    assert parse_prompt({"prompt": "hello"}) == "hello"
    assert parse_prompt({"prompt_token_ids": (1, 2)}) == [1, 2]
    # a TokensPrompt may carry the text its ids came from (LLM.chat passes both)
    assert parse_prompt({"prompt": "hello", "prompt_token_ids": [1]}) == [1]
    with pytest.raises(ValueError, match=r"keys \['prompt', 'text'\] is not accepted"):
        parse_prompt({"prompt": "hello", "text": "x"})
