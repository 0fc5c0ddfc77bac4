"""ModelStates with one planted row-state bug, for the Granite hybrid fixtures:

- ``IgnoresSnapshot``: starts a prefix-cache hit from a zero state (the snapshot slot in
  ``NewRequest.state_slot`` is ignored): CR-EQ-09 must catch it.
- ``ConvNotReset``: every request continues from its row's saved state (a zero state on
  add stands for "no initial state", which is exact when the reset is complete), and the
  reset zeroes a reused row's SSM state but not its conv window: CR-STATE-01 must catch it.
"""
from __future__ import annotations

import dataclasses

from model_states.mamba_hybrid import MambaHybridModelState


class IgnoresSnapshot(MambaHybridModelState):
    def add_request(self, row, request):
        super().add_request(row, dataclasses.replace(request, state_slot=-1))


class ConvNotReset(MambaHybridModelState):
    def prepare_attn(self, batch, *, for_capture=False):
        md = super().prepare_attn(batch, for_capture=for_capture)
        meta = md.extra["mamba"]
        meta["has_initial_state"].fill_(True)
        meta["has_initial_state_cpu"].fill_(True)
        return md

    def apply_staged_writes(self) -> None:
        rows = list(self._reset_rows)
        conv = {name: t[0][rows].clone() for name, t in self._row_states.items()} if rows else {}
        super().apply_staged_writes()
        for name, saved in conv.items():
            self._row_states[name][0][rows] = saved
