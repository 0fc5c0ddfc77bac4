"""The engine-core wire messages round-trip: params, logprobs, tensors as bytes + dtype + shape."""
from __future__ import annotations

import pytest
import torch

msgspec = pytest.importorskip("msgspec")

from core_runner.engine import core_messages as M  # noqa: E402
from core_runner.pooling_params import PoolingParams  # noqa: E402
from core_runner.sampling_params import SamplingParams  # noqa: E402


def test_a_request_and_an_abort_round_trip():
    sp = SamplingParams(max_tokens=7, temperature=0.5, stop=["\n"], logit_bias={3: -1.5}, seed=11, logprobs=2)
    req = M.EngineCoreRequest("r-1", [1, 2, 3], sp, None, 12.5)
    back = M.decode_to_core(M.encode(req))
    assert isinstance(back, M.EngineCoreRequest) and back.sampling_params == sp and back.prompt_token_ids == [1, 2, 3]
    pooled = M.EngineCoreRequest("e-1", [4], None, PoolingParams(task="embed", dimensions=8), 0.0)
    assert M.decode_to_core(M.encode(pooled)).pooling_params == pooled.pooling_params
    assert M.decode_to_core(M.encode(M.EngineCoreAbort(["r-1", "r-2"]))) == M.EngineCoreAbort(["r-1", "r-2"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_steps_outputs_round_trip_with_a_tensor_as_bytes(dtype):
    vec = torch.randn(2, 5).to(dtype)
    outs = M.EngineCoreOutputs([
        M.EngineCoreOutput("a", [5, 6], [{5: -0.1, 9: -2.0}, {6: -0.3}]),
        M.EngineCoreOutput("b", [], finish_reason="stop", stop_reason="\n", cumulative_logprob=-1.25),
        M.EngineCoreOutput("c", [], finish_reason="stop", pooled=M.tensor_to_wire(vec)),
    ], num_running=2, num_waiting=1, kv_cache_usage=0.25)
    back = M.decode_from_core(M.encode(outs))
    assert back.outputs[0].new_logprobs == [{5: -0.1, 9: -2.0}, {6: -0.3}] and not back.outputs[0].finished
    assert back.outputs[1].finished and back.outputs[1].stop_reason == "\n" and back.num_waiting == 1
    got = M.tensor_from_wire(back.outputs[2].pooled)
    assert got.dtype == dtype and torch.equal(got, vec)


def test_a_malformed_message_fails_on_decode_with_the_path_of_the_bad_value():
    bad = msgspec.msgpack.encode(["abort", [1]])  # an abort whose request id is an int
    with pytest.raises(msgspec.ValidationError, match=r"Expected `str`, got `int` - at `\$\[1\]\[0\]`"):
        M.decode_to_core(bad)
    with pytest.raises(ValueError, match="not a torch dtype"):
        M.tensor_from_wire(M.WireTensor("uint77", [1], b"\x00"))


def test_the_control_messages_round_trip_and_atmost_travels_as_its_value():
    from core_runner.sampling_params import AtMost

    sp = SamplingParams(max_tokens=AtMost(9), structured_outputs={"choice": ["a", "b"]}, extra_args={"k": [1, 2]})
    back = M.decode_to_core(M.encode(M.EngineCoreRequest("r", [1], sp, None, 0.0, seed=5)))
    assert back.sampling_params.max_tokens == 9 and back.seed == 5
    got = back.sampling_params
    assert got.structured_outputs.choice == ["a", "b"] and got.extra_args == {"k": [1, 2]}
    assert isinstance(M.decode_to_core(M.encode(M.EngineCoreShutdown())), M.EngineCoreShutdown)
    ready = M.EngineCoreReady("m", "/p", None, "Arch", ["generate"], 128, 20, 0, 2048, [2], 4096, True, "{}",
                              {"temperature": 0.8}, 123)
    assert M.decode_from_core(M.encode(ready)) == ready
    failed = M.EngineCoreFailed("startup", "builtins", "ValueError", "bad model", "Traceback ...")
    assert M.decode_from_core(M.encode(failed)) == failed
    refused = M.EngineCoreOutputs([M.EngineCoreOutput("r", [], finish_reason="error", refused="no")])
    assert M.decode_from_core(M.encode(refused)).outputs[0].refused == "no"


def test_the_client_rebuilds_the_cores_error_as_its_own_type():
    from core_runner.engine.mp_client import rebuild_error

    err = rebuild_error(M.EngineCoreFailed("startup", "builtins", "FileNotFoundError", "no such dir", "tb"))
    assert type(err) is FileNotFoundError and str(err) == "no such dir" and "tb" in err.__notes__[0]
    err = rebuild_error(M.EngineCoreFailed("startup", "nowhere.module", "Odd", "it broke"))
    assert type(err) is RuntimeError and "Odd: it broke" in str(err)
