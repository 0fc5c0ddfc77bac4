"""InputBatch: this step's inputs, gathered from persistent state through idx_mapping."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class InputBatch:
    """Step inputs. Requests appear in batch order (decode rows first).

    Device tensors feed the model; ``*_cpu`` twins are host copies the scheduler already
    knew (no device read needed) for planning and the reference backends.
    """

    req_ids: list[str]
    num_reqs: int
    num_tokens: int
    idx_mapping: torch.Tensor  # [num_reqs] rows of RequestState
    idx_mapping_cpu: torch.Tensor
    query_start_loc: torch.Tensor  # [num_reqs + 1]
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor  # [num_reqs] cached tokens after this step
    seq_lens_cpu: torch.Tensor
    num_computed_cpu: torch.Tensor  # [num_reqs] cached tokens before this step
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    slot_mapping: torch.Tensor  # [num_tokens], -1 = pad
    block_tables: torch.Tensor  # [num_reqs, max_blocks_per_req]
    logits_indices: torch.Tensor  # [num_reqs] last token of each request
    max_query_len: int
    max_seq_len: int
    is_dummy: bool = False
