"""The serve bench's reading of the server's TTFT histogram (benchmarks/serve_bench.py): the
API-side TTFT it prints next to the client's, to tell a late admission from a late delivery."""
from __future__ import annotations

from benchmarks import serve_bench

METRICS = """# HELP vllm:time_to_first_token_seconds Time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.04",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 7.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 8.0
vllm:time_to_first_token_seconds_count{model_name="m"} 8.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 2.5
vllm:inter_token_latency_seconds_count{model_name="m"} 99.0
vllm:time_to_first_token_seconds_created{model_name="m"} 1.7e9
"""


def test_ttft_histogram_is_read_by_bucket_and_total():
    total, count, buckets = serve_bench.parse_ttft(METRICS)
    assert (total, count) == (2.5, 8.0)
    assert buckets == {0.04: 3.0, 0.5: 7.0, float("inf"): 8.0}
    assert serve_bench.parse_ttft("") == (0.0, 0.0, {})
