"""The matcher bookkeeping of structured outputs under speculative decoding (demo vocabulary):
``GrammarRequest.fill_verification`` writes one mask per verification position while the
grammar accepts the proposals, stops at a refused or completing proposal or at proposals
it does not know, and leaves the matcher where it was (a rejected proposal rolls back);
``accept`` keeps no more proposals than the grammar could mask."""
from __future__ import annotations

import pytest
import torch
from test_spec_decode import _batch

from core_runner.demo import demo_checkpoint
from core_runner.runner.spec_decode import accept, verification_view
from core_runner.structured_outputs import StructuredOutputsParams
from core_runner.structured_outputs.manager import StructuredOutputManager

EOS = 0


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_checkpoint())


@pytest.fixture(scope="module")
def manager(tok):
    m = StructuredOutputManager(tok, 2048)
    yield m
    m.shutdown()


def grammar(manager, **constraint):
    g = manager.request(StructuredOutputsParams(**constraint), (EOS,))
    g.future.result()
    return g


def masks(g, k: int) -> tuple[int, torch.Tensor]:
    bm = torch.zeros((k + 1, 64), dtype=torch.int32)
    return g.fill_verification(bm, 0, k), bm


def allowed(bm: torch.Tensor, row: int) -> set[int]:
    bits = ((bm[row, :, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten()
    return set(bits.nonzero().flatten().tolist())


def test_masks_follow_the_proposals_and_the_matcher_rolls_back(manager, tok):
    g = grammar(manager, regex=r"ab(cd)+")
    a, b, c, d = (tok.convert_tokens_to_ids(ch) for ch in "abcd")
    g.sync([a])  # one output token known
    before = torch.zeros((1, 64), dtype=torch.int32)
    g.fill(before, 0)
    g.note_proposals(1, [b, c, d, a])  # the 4th is refused by the grammar
    n, bm = masks(g, 4)
    assert n == 4  # the first position, then one mask after each accepted proposal (b, c, d)
    assert b in allowed(bm, 0) and a not in allowed(bm, 0)
    assert allowed(bm, 1) >= {c} and d not in allowed(bm, 1)
    assert d in allowed(bm, 2) and c not in allowed(bm, 2)
    assert c in allowed(bm, 3) and EOS in allowed(bm, 3) and a not in allowed(bm, 3)
    # the walk left the matcher as it was: same count fed, same next-token mask
    assert g.num_fed == 1 and torch.equal(bm[:1], before)
    g.sync([a, b, c])  # the step kept two proposals: fed as any tokens
    after = torch.zeros((1, 64), dtype=torch.int32)
    g.fill(after, 0)
    assert g.num_fed == 3 and allowed(after, 0) >= {d} and c not in allowed(after, 0)


def test_a_refused_first_proposal_gives_one_mask(manager, tok):
    g = grammar(manager, regex=r"ab(cd)+")
    g.sync([])
    g.note_proposals(0, [tok.convert_tokens_to_ids("c")] * 3)
    n, bm = masks(g, 3)
    assert n == 1 and g.num_fed == 0 and not bm[1:].any()


def test_unknown_or_stale_proposals_give_one_mask(manager, tok):
    g = grammar(manager, regex=r"ab(cd)+")
    a, b = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b")
    assert masks(g, 2)[0] == 1  # nothing noted
    g.note_proposals(0, [a, b])
    g.sync([a])  # the proposals were for output index 0, the matcher is at 1 now
    assert masks(g, 2)[0] == 1


def test_a_completing_proposal_ends_the_masks(manager, tok):
    g = grammar(manager, choice=["red"])
    red = tok.encode("red")
    assert len(red) == 1
    g.note_proposals(0, [red[0], EOS, red[0]])
    n, _ = masks(g, 3)
    # red, then EOS completes the grammar: the sample after red may be EOS, nothing may follow it
    assert n == 2 and not g.terminated and g.num_fed == 0


def test_accept_keeps_no_more_than_the_cap():
    # two requests verifying proposals 7, 8 after 6 known tokens; both samples match both
    batch = _batch(q_lens=[3, 3], computed=[5, 5], rows=[0, 1])
    v = verification_view(batch, [2, 2])
    table = torch.zeros((2, 16), dtype=torch.int32)
    table[:, 6:8] = torch.tensor([7, 8], dtype=torch.int32)
    sampled = torch.tensor([7, 8, 9, 7, 8, 9])
    args = (sampled, v, batch.idx_mapping.long(), torch.full((2,), 6, dtype=torch.int32), table)
    kept, final, _ = accept(*args)
    assert kept.tolist() == [2, 2] and final.tolist() == [9, 9]
    kept, final, _ = accept(*args, cap=torch.tensor([2, 0]))  # request 1's grammar masked its first position only
    assert kept.tolist() == [2, 0] and final.tolist() == [9, 7]
