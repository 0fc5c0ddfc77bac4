"""Which steps replay a CUDA graph: the capture sizes from max_cudagraph_capture_size and the
graph a step of some size selects (host logic only: capture and replay are GPU tests)."""
from __future__ import annotations

import pytest

from core_runner.cli import _engine_options, build_parser
from core_runner.runner.cuda_graphs import DEFAULT_CAPTURE_SIZES, CudaGraphManager, GraphKey, capture_sizes


def test_default_sizes_end_at_1024():
    assert capture_sizes(None) == DEFAULT_CAPTURE_SIZES and DEFAULT_CAPTURE_SIZES[-1] == 1024


@pytest.mark.parametrize("max_size", [1, 100, 512, 1024, 5000, 8192])
def test_sizes_end_at_the_maximum_and_pad_by_at_most_half(max_size):
    sizes = capture_sizes(max_size)
    assert sizes[-1] == max_size and list(sizes) == sorted(set(sizes))
    assert set(s for s in DEFAULT_CAPTURE_SIZES if s < max_size) <= set(sizes)
    big = [s for s in sizes if s >= 1024]
    assert all(b <= 1.5 * a for a, b in zip(big, big[1:]))


def test_a_prefill_step_selects_a_graph_only_up_to_the_maximum():
    big = CudaGraphManager(capture_sizes(8192), max_num_reqs=1024, max_num_tokens=8192)
    small = CudaGraphManager(capture_sizes(None), max_num_reqs=1024, max_num_tokens=8192)
    assert big.select(64, 8192, False) == GraphKey(False, 1024, 8192)
    assert big.select(200, 5000, False) == GraphKey(False, 1024, 6144)
    assert big.select(1024, 1024, True) == GraphKey(True, 1024, 1024)  # decode keys unchanged
    assert small.select(64, 8192, False) is None and "exceeds the capture sizes" in next(iter(small.eager_reasons))
    # sizes past the token budget are never captured
    assert max(k.num_tokens for k in CudaGraphManager(capture_sizes(16384), 1024, 8192).keys()) == 8192


def test_cli_flag_reaches_the_engine_options():
    a = build_parser().parse_args(["generate", "--max-cudagraph-capture-size", "4096", "hi"])
    assert _engine_options(a)["max_cudagraph_capture_size"] == 4096
