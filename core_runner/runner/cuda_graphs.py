"""CudaGraphManager: capture sizes, padding, capture and replay with plain PyTorch APIs.

Two families of full-model graphs (embedding through final norm; the LM head runs
eagerly on the real rows only):
- decode: every request has one query token; keyed by the padded request count.
- mixed: prefill chunks and decode rows; keyed by the padded token count, with room
  for min(tokens, max_num_reqs) requests and attention bounds baked at the padded size.
Padded requests point at the scratch row with an empty query (seq_len 0); padded
tokens write to the pad slot -1. A batch that fits no graph runs eagerly, with a
logged reason.
"""
from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)

DEFAULT_CAPTURE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 896, 1024)
# past 1024 tokens (prefill steps) a size pads a batch by at most half of the one below
_LARGE_CAPTURE_SIZES = (1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768)


def capture_sizes(max_size: int | None) -> tuple[int, ...]:
    """The graph sizes up to ``max_size`` tokens (EngineConfig.max_cudagraph_capture_size;
    None: 1024): the default ladder cut there, or extended by larger steps, ending at
    ``max_size`` itself so that a full step of that many tokens needs no padding."""
    if max_size is None:
        return DEFAULT_CAPTURE_SIZES
    ladder = DEFAULT_CAPTURE_SIZES + _LARGE_CAPTURE_SIZES
    return tuple(sorted({s for s in ladder if s < max_size} | {max_size}))


@dataclass(frozen=True, slots=True)
class GraphKey:
    decode: bool
    num_reqs: int  # padded
    num_tokens: int  # padded


class CudaGraphManager:
    def __init__(self, capture_sizes: tuple[int, ...], max_num_reqs: int, max_num_tokens: int) -> None:
        sizes = sorted(set(capture_sizes))
        self.decode_sizes = [s for s in sizes if s <= min(max_num_reqs, max_num_tokens)]
        self.mixed_sizes = [s for s in sizes if s <= max_num_tokens]
        self.max_num_reqs = max_num_reqs
        self.graphs: dict[GraphKey, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.eager_reasons: dict[str, int] = {}
        self.replays: dict[GraphKey, int] = {}

    def keys(self) -> list[GraphKey]:
        decode = [GraphKey(True, s, s) for s in self.decode_sizes]
        mixed = [GraphKey(False, min(s, self.max_num_reqs), s) for s in self.mixed_sizes]
        return decode + mixed

    def select(self, num_reqs: int, num_tokens: int, uniform_decode: bool) -> GraphKey | None:
        if uniform_decode:
            i = bisect.bisect_left(self.decode_sizes, num_reqs)
            if i < len(self.decode_sizes):
                s = self.decode_sizes[i]
                return GraphKey(True, s, s)
        i = bisect.bisect_left(self.mixed_sizes, num_tokens)
        if i < len(self.mixed_sizes):
            s = self.mixed_sizes[i]
            key = GraphKey(False, min(s, self.max_num_reqs), s)
            if num_reqs <= key.num_reqs:
                return key
        reason = f"batch of {num_tokens} tokens / {num_reqs} requests exceeds the capture sizes"
        if reason not in self.eager_reasons:
            logger.info("CUDA graph skipped, running eager: %s", reason)
        self.eager_reasons[reason] = self.eager_reasons.get(reason, 0) + 1
        return None

    def capture(self, key: GraphKey, run: Callable[[], torch.Tensor]) -> None:
        """Warm up ``run`` once, then record it; its output is the replay output."""
        graph, out = capture_graph(run, self.pool)
        self.pool = graph.pool()
        self.graphs[key] = (graph, out)

    def has(self, key: GraphKey) -> bool:
        return key in self.graphs

    def replay(self, key: GraphKey) -> torch.Tensor:
        graph, out = self.graphs[key]
        graph.replay()
        self.replays[key] = self.replays.get(key, 0) + 1
        return out


def capture_graph(run: Callable[[], Any], pool: Any = None) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Warm ``run`` up once on a side stream, then record it into a graph drawing on
    ``pool`` (graphs that never replay at the same time share one); returns the graph
    and ``run``'s output, which every replay overwrites."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out
