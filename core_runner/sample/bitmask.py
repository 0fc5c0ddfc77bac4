"""Structured outputs in the sampler: a packed token bitmask, applied before every other stage.

Each grammar row's allowed next tokens arrive as a row of int32 words (bit ``t % 32`` of
word ``t // 32`` set = token t allowed, xgrammar's layout); disallowed logits become -inf.
The host fills the mask of step N+1 once step N's tokens are known: ``GrammarStage.prepare``
runs after the forward of step N+1 is launched, reads step N's copy-out (the wait overlaps
that forward on the device), advances the matchers, fills a pinned mask and copies it
non-blocking. A verification step (speculative decoding) gets 1 + k masks per grammar
request, one per position, walked through its proposals (``GrammarRequest.fill_verification``),
and leaves in ``caps`` how many proposals each may keep. Design and the async pipeline:
docs/structured_outputs.md.
"""
from __future__ import annotations

from typing import Any

import torch

from core_runner.sample.stage import Stage, Step, host_to_device
from core_runner.step_data.scheduler_output import NewRequest
from core_runner.structured_outputs.manager import BatchFill


def apply_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """In place: logits[rows[j], t] = -inf where bit t of bitmask[j] is 0 (torch reference)."""
    v = logits.shape[-1]
    cols = torch.arange(v, device=logits.device)
    words = bitmask[:, cols // 32]
    allowed = ((words >> (cols % 32).to(words.dtype)) & 1).bool()
    sub = logits[rows]
    logits[rows] = sub.masked_fill(~allowed, float("-inf"))


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, use_triton: bool) -> None:
    if use_triton:
        from core_runner.sample.bitmask_triton import apply_bitmask_triton

        apply_bitmask_triton(logits, bitmask, rows)
    else:
        apply_bitmask_ref(logits, bitmask, rows)


class GrammarStage(Stage):
    """Per row: the request's ``GrammarRequest`` (host only) and its prompt length.

    ``track(handle, batch)`` remembers the last step's copy-out and, per grammar row of that
    step, the output index its sampled token has; ``prepare`` feeds those tokens first."""

    def __init__(self, num_rows: int, device: torch.device, use_triton: bool = False) -> None:
        super().__init__(num_rows, device)
        self.grammar: list[Any] = [None] * num_rows
        self.num_prompt = [0] * num_rows
        self.use_triton = use_triton
        self._pending: tuple[Any, list[tuple[Any, int, int]]] | None = None
        self._host: torch.Tensor | None = None
        self._counts: list[int] | None = None
        self._req_of: dict[int, int] = {}
        self.caps: torch.Tensor | None = None
        self._batch_fill = BatchFill()

    def add_request(self, row: int, req: NewRequest) -> None:
        g = getattr(req, "structured_output", None)
        self.grammar[row] = g
        self.num_prompt[row] = req.num_prompt_tokens
        self.users.discard(row)
        if g is not None:
            g.reset(req.token_ids[req.num_prompt_tokens:])  # a resumed request replays its output
            self.users.add(row)

    def remove_request(self, row: int) -> None:
        super().remove_request(row)
        self.grammar[row] = None
        self.num_prompt[row] = 0

    def host_state(self) -> dict[str, Any]:
        """Per-row mirrors only (the pending copy-out and scratch mask are per step, not per row)."""
        return {"users": sorted(self.users), "num_prompt": list(self.num_prompt),
                "grammar": [g is not None for g in self.grammar]}

    def _out_index(self, step: Step, i: int) -> int:
        return int(step.batch.seq_lens_cpu[i]) - self.num_prompt[step.rows[i]]

    def _feed_pending(self) -> None:
        if self._pending is None:
            return
        handle, entries = self._pending
        self._pending = None
        result = handle.get()  # waits for the previous step's copy-out, not for this step
        sampled = dict(zip(result.req_ids, result.sampled_token_ids))
        for g, index, req_id in entries:
            tok = sampled.get(req_id)
            if tok is None or tok < 0:
                continue
            tokens = result.spec_token_ids.get(req_id, []) + [tok]  # kept proposals, then the sample
            for j, t in enumerate(tokens):
                g.feed(index + j, t)
            props = result.spec_proposals.get(req_id)
            if props is not None:
                g.note_proposals(index + len(tokens), props)

    def begin_verification(self, counts: list[int]) -> None:
        """The next ``prepare`` is a verification view: request i (of the step's batch) has
        1 + counts[i] consecutive logits rows. ``prepare`` then leaves in ``caps`` how many
        proposals each request may keep (None: no grammar row verifies)."""
        self._counts = counts
        self.caps = None

    def prepare(self, step: Step, vocab: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        counts, self._counts = self._counts, None
        users = self.in_batch(step)
        self._step_entries = []
        if not users:
            return None
        self._feed_pending()
        groups = [(i, 0) for i in users] if counts is None else self._groups(step, counts)
        words = -(-vocab // 32)
        need = sum(1 + k for _, k in groups)
        if self._host is None or self._host.shape[1] != words or self._host.shape[0] < need:
            self._host = torch.empty((max(need, 8), words), dtype=torch.int32,
                                     pin_memory=self.device.type == "cuda")
        positions: list[int] = []
        caps = list(counts) if counts is not None else None
        batch: list[tuple[Any, int]] = []  # plain decode masks, filled together below
        for i, k in groups:
            g = self.grammar[step.rows[i]]
            # a decode row samples output index num_fed; the host's count is a bound under async
            # speculation (in-flight proposals counted as kept). Below it: a prefill chunk
            # before the end of the known tokens, whose sample is not real
            if g is None or self._out_index(step, i) < g.num_fed:
                continue
            self._step_entries.append((g, g.num_fed, step.batch.req_ids[i]))
            if k == 0:
                filled = int(g.wants_mask)
                if filled:
                    batch.append((g, len(positions)))
            else:
                filled = g.fill_verification(self._host, len(positions), k)
            positions.extend(range(i, i + filled))
            if caps is not None and filled:
                caps[self._req_of[i]] = filled - 1
        if batch:
            self._batch_fill([g for g, _ in batch], self._host, [r for _, r in batch])
        self._publish_caps(caps, counts)
        if not positions:
            return None
        mask = self._host[: len(positions)]
        rows = torch.tensor(positions, dtype=torch.int64)
        if self.device.type == "cuda":
            return mask.to(self.device, non_blocking=True), host_to_device(rows, self.device)
        return mask.clone(), rows

    def _groups(self, step: Step, counts: list[int]) -> list[tuple[int, int]]:
        """(first logits row, k) of each verifying request that has a grammar."""
        self._req_of, groups, first = {}, [], 0
        for req, k in enumerate(counts):
            if self.grammar[step.rows[first]] is not None:
                groups.append((first, k))
                self._req_of[first] = req
            first += 1 + k
        return groups

    def _publish_caps(self, caps: list[int] | None, counts: list[int] | None) -> None:
        if caps is not None and caps != list(counts):
            self.caps = host_to_device(torch.tensor(caps, dtype=torch.int64), self.device)

    def track(self, handle: Any) -> None:
        """The copy-out of the step just launched: its grammar rows' tokens are fed next step."""
        entries = getattr(self, "_step_entries", None)
        self._pending = (handle, entries) if entries else None
        self._step_entries = []

    def apply(self, logits: torch.Tensor, x: tuple[torch.Tensor, torch.Tensor]) -> None:
        apply_bitmask(logits, x[0], x[1], self.use_triton)
