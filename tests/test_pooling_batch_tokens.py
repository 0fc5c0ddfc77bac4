"""A pooling-only model on a GPU gets vLLM's pooling token budget (32,768) when the engine
chose max_num_batched_tokens; a given value, a generating model and the CPU keep theirs."""
from core_runner.config import EngineConfig
from core_runner.engine.defaults import POOLING_MAX_NUM_BATCHED_TOKENS, pooling_batch_tokens


def _config(device: str, **kw) -> EngineConfig:
    c = EngineConfig(model="unused", device="cpu", **kw)
    object.__setattr__(c, "device", device)  # the rule reads the device name only; no GPU here
    return c


def test_pooling_model_on_a_gpu_gets_the_pooling_budget():
    c = _config("cuda:0", max_model_len=512)
    assert c.max_num_batched_tokens < POOLING_MAX_NUM_BATCHED_TOKENS  # the engine's own choice
    assert pooling_batch_tokens(c, ("classify", "score")) == POOLING_MAX_NUM_BATCHED_TOKENS
    assert pooling_batch_tokens(c, ("embed",)) == POOLING_MAX_NUM_BATCHED_TOKENS


def test_capped_by_what_the_rows_can_use():
    c = _config("cuda", max_model_len=128, max_num_seqs=16)
    assert pooling_batch_tokens(c, ("embed",)) == 16 * 128


def test_given_budget_generating_model_and_cpu_keep_theirs():
    given = _config("cuda", max_model_len=512, max_num_batched_tokens=4096)
    assert pooling_batch_tokens(given, ("embed",)) == 4096
    chosen = _config("cuda", max_model_len=512)
    assert pooling_batch_tokens(chosen, ("generate",)) == chosen.max_num_batched_tokens
    cpu = EngineConfig(model="unused", device="cpu", max_model_len=512)
    assert pooling_batch_tokens(cpu, ("embed",)) == cpu.max_num_batched_tokens
