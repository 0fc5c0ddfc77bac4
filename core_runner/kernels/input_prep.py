"""Step inputs built from persistent request state (torch reference).

Everything is gathered through ``idx_mapping`` (batch index -> state row); the token
ids of a decode row come from the token table, where post-update wrote the last
sampled token, so the host never needs the previous step's tokens.
"""
from __future__ import annotations

import torch


def prepare_inputs_ref(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_computed: torch.Tensor,
    token_ids: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    num_tokens: int,
) -> dict[str, torch.Tensor]:
    """Returns input_ids, positions, seq_lens, slot_mapping, block_tables, logits_indices.

    Tokens past ``query_start_loc[-1]`` (padding up to ``num_tokens``) get input id 0,
    position 0 and slot -1 (no cache write).
    """
    device = idx_mapping.device
    num_reqs = idx_mapping.numel()
    rows = idx_mapping.long()
    q_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    num_real = int(query_start_loc[-1])
    req_of_token = torch.repeat_interleave(torch.arange(num_reqs, device=device), q_lens)
    token_rows = rows[req_of_token]
    offsets = torch.arange(num_real, device=device) - query_start_loc[:-1].long()[req_of_token]
    pos = num_computed.long()[token_rows] + offsets
    input_ids = torch.zeros(num_tokens, dtype=torch.int32, device=device)
    positions = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    slot_mapping = torch.full((num_tokens,), -1, dtype=torch.int64, device=device)
    input_ids[:num_real] = token_ids[token_rows, pos]
    positions[:num_real] = pos
    blocks = block_table[token_rows, pos // block_size].long()
    slot_mapping[:num_real] = blocks * block_size + pos % block_size
    return {
        "input_ids": input_ids,
        "positions": positions,
        "seq_lens": (num_computed.long()[rows] + q_lens).to(torch.int32),
        "slot_mapping": slot_mapping,
        "block_tables": block_table[rows],
        "logits_indices": (query_start_loc[1:].long() - 1).clamp_min(0),
    }


def post_update_ref(
    idx_mapping: torch.Tensor,
    num_scheduled: torch.Tensor,
    sampled: torch.Tensor,
    num_computed: torch.Tensor,
    num_tokens: torch.Tensor,
    token_ids: torch.Tensor,
) -> None:
    """After sampling: advance num_computed; where a request consumed all its known
    tokens this step, append the sampled token (else it was a partial prefill chunk)."""
    rows = idx_mapping.long()
    new_computed = num_computed[rows] + num_scheduled.to(num_computed.dtype)
    n_tok = num_tokens[rows]
    done = (new_computed >= n_tok) & (n_tok < token_ids.shape[1])
    token_ids[rows[done], n_tok[done].long()] = sampled[done].to(token_ids.dtype)
    num_tokens[rows] = n_tok + done.to(n_tok.dtype)
    num_computed[rows] = new_computed
