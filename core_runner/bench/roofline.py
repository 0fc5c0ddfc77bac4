"""Memory-bound limits: the fastest a workload could run if every step only streamed
the weights and the KV cache it reads at the measured copy bandwidth."""
from __future__ import annotations

from collections.abc import Sequence


def decode_roofline_tok_s(
    workload: list[tuple[list[int], int, float]], weight_bytes: int, kv_bytes_per_token: int,
    bandwidth: float, max_num_seqs: int, state_bytes_per_row: int = 0,
    windowed_kv: Sequence[tuple[int, int]] = (),
) -> float:
    """Output tok/s if all requests decode together in waves of ``max_num_seqs`` and each
    step costs (weights + live context x KV bytes + live rows x 2 x per-row state bytes,
    since recurrent state is read and written back) / bandwidth. Prefill is ignored.

    ``kv_bytes_per_token`` is what the layers reading the whole context hold per token;
    ``windowed_kv`` lists (window, bytes per token) of sliding-window layers, which read
    at most ``window`` tokens of each row's context. An attention-free model (Mamba2) has
    only weights and state: per row and step its whole state is read and written once."""
    total_time, total_out = 0.0, 0
    for w in range(0, len(workload), max_num_seqs):
        wave = workload[w: w + max_num_seqs]
        steps = max(o for _, o, _ in wave)
        for s in range(steps):
            live = [len(p) + s for p, o, _ in wave if s < o]
            windowed = sum(b * min(ctx, w) for w, b in windowed_kv for ctx in live)
            total_time += (weight_bytes + sum(live) * kv_bytes_per_token + windowed
                           + 2 * len(live) * state_bytes_per_row) / bandwidth
        total_out += sum(o for _, o, _ in wave)
    return total_out / total_time if total_time else 0.0
