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
