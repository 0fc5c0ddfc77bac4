"""CPU tests of the bench's speculative decoding measurement: the W2R workload, the
``--speculative-config`` variants and their comparison, and the deepseek-v3-mtp shape."""
from __future__ import annotations

import json
import random

import pytest
import torch

from core_runner.bench.shapes import DEEPSEEK_V3_MTP, SHAPES, config_only_checkpoint, deepseek_v3_mtp_config
from core_runner.bench.spec import OFF, spec_metrics, spec_variants
from core_runner.bench.workloads import make_workload

VOCAB = 151936
NGRAM3 = '{"method": "ngram", "num_speculative_tokens": 3}'


def _period(prompt: list[int]) -> int:
    return next(p for p in range(1, len(prompt) + 1) if all(prompt[i] == prompt[i - p] for i in range(p, len(prompt))))


def test_w2r_keeps_w2_lengths_and_repeats_a_seeded_segment():
    w2, w2r = make_workload("W2", VOCAB), make_workload("W2R", VOCAB)
    assert [(len(p), o, t) for p, o, t in w2r] == [(len(p), o, t) for p, o, t in w2] and len(w2r) == 256
    assert w2r == make_workload("w2r", VOCAB) and make_workload("W2R", VOCAB, 10) == w2r[:10]
    rng = random.Random(0)  # the recipe: per request a segment length, then its tokens
    for prompt, _, _ in w2r[:3]:
        segment = [rng.randrange(3, VOCAB) for _ in range(rng.randint(8, 32))]
        assert prompt == (segment * len(prompt))[: len(prompt)]
    assert all(8 <= _period(p) <= 32 and len(p) >= 3 * _period(p) for p, _, _ in w2r)
    state = random.getstate()
    make_workload("W2R", VOCAB, 4)
    assert random.getstate() == state
    small = make_workload("W2R", 512, 20, scale=16)  # smoke size: still a repeated segment of >= 4 tokens
    assert all(len(p) == max(1, len(q) // 16) and 4 <= _period(p) < len(p) for (p, _, _), (q, _, _)
               in zip(small, make_workload("W2R", 512, 20)))


def test_prompt_lookup_finds_w2r_continuations():
    from core_runner.runner.spec_decode import propose_ngram

    wl = make_workload("W2R", VOCAB, 16)
    width = max(len(p) for p, _, _ in wl)
    table = torch.zeros(len(wl), width, dtype=torch.int64)
    for i, (p, _, _) in enumerate(wl):
        table[i, : len(p)] = torch.tensor(p)
    lengths = torch.tensor([len(p) for p, _, _ in wl])
    proposals = propose_ngram(table, torch.arange(len(wl)), lengths, 3, 5, 5)
    for (p, _, _), got in zip(wl, proposals.tolist()):
        period = _period(p)  # the prompt continued: its next 3 tokens are one period back
        assert got == [p[len(p) - period + j] for j in range(3)]


def test_temperature_replaces_the_workloads():
    assert {t for _, _, t in make_workload("W2R", VOCAB, 5)} == {0.6}
    greedy = make_workload("W2R", VOCAB, 5, temperature=0)
    assert {t for _, _, t in greedy} == {0.0} and [p for p, _, _ in greedy] == [p for p, _, _ in make_workload(
        "W2R", VOCAB, 5)]
    with pytest.raises(ValueError, match="temperature"):
        make_workload("W2", VOCAB, 2, temperature=-1)


def test_spec_variants_parse_label_and_name_bad_values():
    assert spec_variants(None) == spec_variants([]) == spec_variants(["off"])
    vs = spec_variants(["off", NGRAM3, NGRAM3, '{"method": "ngram", "num_speculative_tokens": 3, '
                        '"prompt_lookup_max": 4}', '{"method": "mtp", "num_speculative_tokens": 1}', "OFF"])
    assert [v.label for v in vs] == [OFF, "ngram_k3", "ngram_k3_2", "mtp_k1"]
    assert vs[0].config is None and vs[1].config == json.loads(NGRAM3)
    for value, words in (("on", "neither 'off' nor JSON"), ("[1, 2]", "not a JSON object"),
                         ('{"method": "medusa", "num_speculative_tokens": 2}', "'method'"),
                         ('{"method": "ngram", "num_speculative_tokens": 0}', "'num_speculative_tokens'"),
                         ('{"method": "ngram", "k": 2}', "unknown keys")):
        with pytest.raises(ValueError, match=words) as err:
            spec_variants(["off", value])
        assert "--speculative-config" in str(err.value) and value in str(err.value)


def test_spec_metrics_follow_vllms_definitions():
    m = spec_metrics((2, 6, 1), (12, 36, 16))  # 10 verifications, 30 proposed, 15 accepted
    assert m["acceptance_rate"] == 0.5 and m["mean_accepted_length"] == 2.5 and m["spec_num_drafts"] == 10
    assert spec_metrics((0, 0, 0), (0, 0, 0))["acceptance_rate"] != spec_metrics((0, 0, 0), (0, 0, 0))[
        "acceptance_rate"]  # nan: nothing was proposed


def test_bench_cli_bad_speculative_config_is_a_named_error(capsys):
    from core_runner.cli import main

    rc = main(["bench", "--device", "cpu", "--workload", "W2R", "--speculative-config", "off",
               '{"method": "ngram", "num_speculative_tokens": 99}'])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--speculative-config" in err and "speculative_config['num_speculative_tokens']=99 is invalid" in err


def test_bench_cli_runs_w2r_with_speculation_off_and_ngram(tmp_path, capsys, single_torch_thread):
    from core_runner.cli import main
    from core_runner.demo import demo_checkpoint

    out = tmp_path / "spec.json"
    rc = main(["bench", "--model", demo_checkpoint(), "--device", "cpu", "--dtype", "float32", "--workload", "W2R",
               "--num-requests", "4", "--scale", "16", "--temperature", "0", "--speculative-config", "off", NGRAM3,
               "--json", str(out), "--max-model-len", "256", "--max-num-seqs", "8", "--max-num-batched-tokens", "512"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res) == {"W2R_spec_off", "W2R_spec_ngram_k3", "W2R_spec_ngram_k3_vs_off"}
    off, ngram, cmp = res["W2R_spec_off"], res["W2R_spec_ngram_k3"], res["W2R_spec_ngram_k3_vs_off"]
    assert off["speculative_config"] is None and "acceptance_rate" not in off and off["greedy"]
    assert ngram["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
                                           "prompt_lookup_max": 5}
    assert ngram["spec_num_draft_tokens"] > 0 and 0 <= ngram["spec_num_accepted_tokens"] <= ngram[
        "spec_num_draft_tokens"]
    assert ngram["acceptance_rate"] == ngram["spec_num_accepted_tokens"] / ngram["spec_num_draft_tokens"]
    assert ngram["mean_accepted_length"] == 1 + ngram["spec_num_accepted_tokens"] / ngram["spec_num_drafts"]
    assert off["output_tokens"] == ngram["output_tokens"] and "output_token_ids" not in ngram
    assert cmp["greedy"] and cmp["greedy_outputs_identical"] and cmp["identical_outputs"] == cmp["num_requests"] == 4
    assert cmp["tpot_spec_over_off"] == pytest.approx(ngram["tpot_mean_ms"] / off["tpot_mean_ms"])
    printed = capsys.readouterr().out
    assert "W2R_spec_ngram_k3 vs off: TPOT mean" in printed and "greedy outputs identical: yes (4/4)" in printed
    assert "speculation ngram k=3: acceptance" in printed


def test_deepseek_v3_mtp_shape_keeps_v3s_architecture(tmp_path, monkeypatch):
    """The shape's fields, its config-only checkpoint, and its size: the target counted on the
    meta device (the RoPE table is stubbed out: it has no parameters and cannot be built there)."""
    import core_runner_deepseek.model as deepseek
    from torch import nn

    from core_runner.cli import build_parser
    from core_runner.loader import load_hf_config

    assert [build_parser().parse_args(["bench", "--shape", shape]).shape for shape in SHAPES] == list(SHAPES)
    config = load_hf_config(config_only_checkpoint("deepseek-v3-mtp", tmp_path))
    assert type(config).__name__ == "DeepseekV3Config" and config.architectures == ["DeepseekV3ForCausalLM"]
    published = dict(hidden_size=7168, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                     v_head_dim=128, num_attention_heads=128, moe_intermediate_size=2048, num_experts_per_tok=8,
                     n_group=8, topk_group=4, topk_method="noaux_tc", n_shared_experts=1, first_k_dense_replace=3,
                     num_nextn_predict_layers=1, routed_scaling_factor=2.5, vocab_size=129280)
    assert {k: getattr(config, k) for k in published} == published
    assert (config.num_hidden_layers, config.n_routed_experts) == (12, 32) and config.rope_parameters["factor"] == 40
    assert config.dtype == torch.bfloat16 and DEEPSEEK_V3_MTP["eos_token_id"] is None
    monkeypatch.setattr(deepseek, "get_rope", lambda *a, **k: nn.Identity())
    with torch.device("meta"):
        model = deepseek.DeepseekV3ForCausalLM(deepseek_v3_mtp_config())
    n = sum(p.numel() for p in model.parameters())
    mtp_layer = sum(p.numel() for p in model.model.layers[-1].parameters()) + 2 * 7168 * 7168
    assert 18.3e9 < n < 18.5e9 and 39e9 < 2 * (n + mtp_layer) < 41e9  # bf16 bytes with the MTP layer: ~40 GB


def _mtp_draft_registered() -> bool:
    from core_runner.plugins import load_plugins

    return load_plugins().registry.find_draft(DEEPSEEK_V3_MTP["architectures"][0], "mtp") is not None


@pytest.mark.parametrize("method", ["ngram", "mtp"])
def test_bench_runs_a_shrunk_deepseek_v3_mtp_config(method, tmp_path, monkeypatch, single_torch_thread):
    """The shape's path end to end on a CPU: config only, dummy weights (the MTP layer's too),
    the speculative config passed through, greedy outputs equal to those without it."""
    from core_runner.cli import main

    if method == "mtp" and not _mtp_draft_registered():
        pytest.skip("core_runner_deepseek registers no 'mtp' draft model yet")
    tiny = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32,
                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=16, vocab_size=512,
                max_position_embeddings=4096)
    for key, value in tiny.items():
        monkeypatch.setitem(DEEPSEEK_V3_MTP, key, value)
    monkeypatch.setenv("CORE_RUNNER_CACHE", str(tmp_path))
    out = tmp_path / "ds.json"
    k = 3 if method == "ngram" else 1
    rc = main(["bench", "--load-format", "dummy", "--shape", "deepseek-v3-mtp", "--device", "cpu", "--dtype",
               "float32", "--workload", "W2R", "--num-requests", "3", "--scale", "32", "--temperature", "0",
               "--speculative-config", "off", json.dumps({"method": method, "num_speculative_tokens": k}),
               "--json", str(out), "--max-model-len", "128", "--max-num-seqs", "4", "--max-num-batched-tokens", "256"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res[f"W2R_spec_{method}_k{k}_vs_off"]["greedy_outputs_identical"]
    assert res[f"W2R_spec_{method}_k{k}"]["spec_num_draft_tokens"] > 0


def test_bench_keys_and_comparisons_with_both_flags(monkeypatch, capsys):
    """--prefix-caching and --speculative-config together: one run per pair, each spec variant
    compared with off under the same cache mode, each cache mode compared per variant."""
    from core_runner.bench import run
    from core_runner.cli import build_parser

    calls = []

    def fake(model, name, args, opts, source, prefix_caching, speculative_config, keep_outputs):
        calls.append((prefix_caching, speculative_config and speculative_config["method"]))
        spec = speculative_config is not None
        res = {"output_tok_s": 200.0 if spec else 100.0, "elapsed_s": 1.0, "output_tokens": 8, "steps": 4,
               "preemptions": 0, "ttft_p50_s": 0.1, "ttft_p99_s": 0.1, "tpot_p50_ms": 5.0, "tpot_p99_ms": 5.0,
               "tpot_mean_ms": 5.0 if spec else 10.0, "greedy": False, "prefix_caching": prefix_caching,
               "prompt_tokens": 16, "prefill_tokens_computed": 8 if prefix_caching else 16, "prefix_cache_hits": 8,
               "prefix_cache_queries": 16, "output_token_ids": [[1, 2], [3, 4] if spec else [3, 5]],
               "speculative_config": speculative_config}
        if spec:
            res.update(spec_metrics((0, 0, 0), (4, 12, 6)))
        return res

    monkeypatch.setattr(run, "_bench_workload", fake)
    args = build_parser().parse_args(["bench", "--model", "m", "--workload", "W2R", "--prefix-caching", "on", "off",
                                      "--speculative-config", "off", NGRAM3])
    res = run.bench(args)
    assert calls == [(True, None), (True, "ngram"), (False, None), (False, "ngram")]
    assert set(res) == {"W2R_prefix_caching_on_spec_off", "W2R_prefix_caching_on_spec_ngram_k3",
                        "W2R_prefix_caching_off_spec_off", "W2R_prefix_caching_off_spec_ngram_k3",
                        "W2R_spec_off_prefix_caching_on_vs_off", "W2R_spec_ngram_k3_prefix_caching_on_vs_off",
                        "W2R_prefix_caching_on_spec_ngram_k3_vs_off", "W2R_prefix_caching_off_spec_ngram_k3_vs_off"}
    cmp = res["W2R_prefix_caching_off_spec_ngram_k3_vs_off"]
    assert cmp["tpot_spec_over_off"] == 0.5 and cmp["output_tok_s_spec_over_off"] == 2.0
    assert cmp["identical_outputs"] == 1 and cmp["greedy_outputs_identical"] is None  # sampled: a count only
    assert cmp["acceptance_rate"] == 0.5 and cmp["mean_accepted_length"] == 2.5
    assert "identical sampled outputs 1/2" in capsys.readouterr().out
    one = run.bench(build_parser().parse_args(["bench", "--model", "m", "--workload", "W2R",
                                               "--speculative-config", NGRAM3]))
    assert list(one) == ["W2R"] and "output_token_ids" not in one["W2R"]  # one variant: no suffix, nothing compared
