"""What ``LLM.score`` needs besides running requests: pairing the two inputs as vLLM
does (1-to-1, 1-to-N, N-to-N), a cross-encoder's pair encoding, and cosine scores.

A cross-encoder (a model serving ``score``: a classifier with one label) reads each pair
as one prompt, through the tokenizer's pair template (BERT: ``[CLS] a [SEP] b [SEP]``,
token types 0 for ``[CLS] a [SEP]`` and 1 after, passed on compressed as
``PoolingParams.compressed_token_type_ids``). An embedding model embeds each text once and
scores a pair by the cosine of the two vectors.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from core_runner.engine.outputs import PoolingRequestOutput, ScoringOutput, ScoringRequestOutput


def pair_up(data_1: str | Sequence[str], data_2: str | Sequence[str]) -> list[tuple[str, str]]:
    """The pairs to score: one text_1 against every text_2 (1-to-1, 1-to-N), or the i-th
    with the i-th (N-to-N); other lengths raise ValueError naming both."""
    texts = []
    for name, data in (("data_1", data_1), ("data_2", data_2)):
        items = [data] if isinstance(data, str) else list(data) if isinstance(data, (list, tuple)) else None
        if items is None:
            raise ValueError(f"LLM.score {name} of type {type(data).__name__} is not accepted: expected a str "
                             "or a list of str")
        for i, t in enumerate(items):
            if not isinstance(t, str):
                raise ValueError(f"LLM.score {name}[{i}] is a {type(t).__name__}: expected a str")
        texts.append(items)
    a, b = texts
    if not a or not b:
        raise ValueError(f"LLM.score got {len(a)} text_1 and {len(b)} text_2: both need at least one")
    if len(a) == 1:
        a = a * len(b)
    elif len(a) != len(b):
        raise ValueError(f"LLM.score got {len(a)} text_1 and {len(b)} text_2: pass one text_1 (scored against "
                         "every text_2) or as many as text_2 (scored pairwise), as vLLM's 1:1, 1:N or N:N")
    return list(zip(a, b))


def encode_pairs(tokenizer: Any, pairs: Sequence[tuple[str, str]],
                 truncate: int | None) -> list[tuple[list[int], int | None]]:
    """Each pair's token ids through the tokenizer's pair template, and the first token of
    type 1 (None when the tokenizer gives no types or all are 0). ``truncate``: cut each
    pair to that many tokens (the tokenizer's longest-first truncation). One call for all
    pairs: a fast tokenizer encodes a batch on its own threads, where pair by pair the
    tokenizer call costs more than the model's forward of that pair."""
    if not pairs:
        return []
    kw: dict[str, Any] = {"truncation": True, "max_length": truncate} if truncate is not None else {}
    enc = tokenizer([a for a, _ in pairs], [b for _, b in pairs], return_token_type_ids=True, **kw)
    types_of = enc.get("token_type_ids") or [None] * len(pairs)
    return [_with_segment(list(ids), types) for ids, types in zip(enc["input_ids"], types_of)]


def _with_segment(ids: list[int], types: Sequence[int] | None) -> tuple[list[int], int | None]:
    types = list(types) if types else []
    if 1 not in types:
        return ids, None
    start = types.index(1)
    # slice comparisons run in C: this runs once per pair, a scan in Python cost ~12 us a pair
    if types[:start] != [0] * start or types[start:] != [1] * (len(types) - start):
        raise ValueError(f"the tokenizer's pair encoding has token types {types}: only 0s then 1s "
                         "(two segments) can be passed on")
    return ids, start


def cross_encoder_scores(outs: list[Any]) -> list[ScoringRequestOutput]:
    """Classify outputs of one label each as scores."""
    scored = []
    for o in outs:
        out = None
        if o.outputs is not None:
            if o.outputs.data.numel() != 1:
                raise ValueError(f"request {o.request_id!r}: a score needs one label, the model gave "
                                 f"{o.outputs.data.numel()}")
            out = ScoringOutput(float(o.outputs.data.reshape(-1)[0]))
        scored.append(_as_score(o, out))
    return scored


def cosine_scores(pairs: list[tuple[str, str]], embedded: dict[str, Any]) -> list[ScoringRequestOutput]:
    """One output per pair from the embeddings of its two texts (vLLM's id ``"{id1}_{id2}"``
    and the two prompts' tokens)."""
    scored = []
    for a, b in pairs:
        e1, e2 = embedded[a], embedded[b]
        sim = torch.nn.functional.cosine_similarity(e1.outputs.data.float(), e2.outputs.data.float(), dim=0)
        scored.append(ScoringRequestOutput(
            request_id=f"{e1.request_id}_{e2.request_id}", outputs=ScoringOutput(float(sim)),
            prompt_token_ids=list(e1.prompt_token_ids) + list(e2.prompt_token_ids), finished=True,
            finish_reason="stop", num_cached_tokens=e1.num_cached_tokens + e2.num_cached_tokens,
        ))
    return scored


def _as_score(o: PoolingRequestOutput, out: ScoringOutput | None) -> ScoringRequestOutput:
    return ScoringRequestOutput(
        request_id=o.request_id, outputs=out, prompt_token_ids=o.prompt_token_ids, finished=o.finished,
        prompt=o.prompt, finish_reason=o.finish_reason, num_preemptions=o.num_preemptions,
        num_cached_tokens=o.num_cached_tokens,
    )
