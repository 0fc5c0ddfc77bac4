"""The symmetric window of encoder layers (``bidirectional_window``, ModernBERT's local
attention): the torch reference against transformers' own mask function, the blocks it
reads, and the refusals (a causal layer, both windows at once, a backend without the
feature: Triton, at engine construction).

Blocks wholly before every query's window are replaced in the block table by an id far
outside the cache, so a reference that reads one fails with an index error instead of
passing by luck.
"""
import pytest
import torch
from torch import nn

from core_runner.attention.options import AttentionOptions
from core_runner.attention.torch_backend import TorchPagedAttention, paged_attention_ref
from core_runner.attention.triton_backend import TritonPagedAttention
from core_runner.layers import Attention
from core_runner.oracle import UnsupportedError, check_model_fits

JUNK = 10**6


def build(q_range, seq_len, heads, kv_heads, d, bs, window, seed=0):
    """One request of ``seq_len`` cached tokens whose queries are positions q_range
    (first, seq_len: queries are a request's last tokens); blocks before every query's
    window are junk ids."""
    g = torch.Generator().manual_seed(seed)
    nblk = -(-seq_len // bs)
    num_blocks = nblk + 2
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    bt = torch.full((1, nblk + 1), JUNK, dtype=torch.int32)
    bt[0, :nblk] = perm[:nblk]
    kv = torch.randn(2, num_blocks, bs, kv_heads, d, generator=g)
    blocks = perm[:nblk].long()
    k, v = (kv[i][blocks].reshape(-1, kv_heads, d)[:seq_len] for i in (0, 1))
    first, end = q_range
    if window is not None:
        bt[0, :max(0, first - window) // bs] = JUNK
    q = torch.randn(end - first, heads, d, generator=g)
    qsl = torch.tensor([0, end - first], dtype=torch.int32)
    return q, kv, qsl, torch.tensor([seq_len], dtype=torch.int32), bt, k, v


def transformers_mask(q_pos, k_len, window):
    """True where transformers' bidirectional sliding-window mask lets query q see key k."""
    from transformers.masking_utils import sliding_window_bidirectional_overlay

    see = sliding_window_bidirectional_overlay(window)
    return torch.tensor([[bool(see(0, 0, int(p), kk)) for kk in range(k_len)] for p in q_pos])


def dense(q, k, v, q_pos, scale, window):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).double(), v.repeat_interleave(group, 1).double()
    w = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    if window is not None:
        w = w.masked_fill(~transformers_mask(q_pos, k.shape[0], window)[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", w.softmax(-1), v).float()


@pytest.mark.parametrize("q_range,seq_len,window", [
    ((0, 37), 37, 5),  # a whole encoder prompt, the case the engine runs
    ((0, 37), 37, 0),  # each token sees only itself
    ((30, 45), 45, 4),  # a request's last tokens (the engine's layout): the first 6 blocks are junk
    ((0, 9), 9, 64),  # a window wider than the prompt: every key
])
def test_reference_matches_transformers_mask(q_range, seq_len, window):
    heads, kv_heads, d, bs = 4, 2, 8, 4
    q, kv, qsl, lens, bt, k, v = build(q_range, seq_len, heads, kv_heads, d, bs, window)
    out = paged_attention_ref(q, kv, qsl, lens, bt, 0.3, causal=False, bidirectional_window=window)
    want = dense(q, k, v, torch.arange(*q_range), 0.3, window)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_window_moves_the_output_and_matches_the_backend():
    q, kv, qsl, lens, bt, k, v = build((0, 30), 30, 4, 2, 8, 4, None)
    full = paged_attention_ref(q, kv, qsl, lens, bt, 0.3, causal=False)
    local = paged_attention_ref(q, kv, qsl, lens, bt, 0.3, causal=False, bidirectional_window=3)
    assert (local - full).abs().max() > 1e-2
    md = type("MD", (), dict(query_start_loc_cpu=qsl, seq_lens_cpu=lens, block_tables=bt, causal=False))()
    via = TorchPagedAttention().forward(q, kv, md, 0.3, options=AttentionOptions(bidirectional_window=3))
    torch.testing.assert_close(via, local)


def test_window_bound_is_inclusive():
    """|k - q| == w is seen, w + 1 is not: transformers' ``abs(q_idx - kv_idx) <= sliding_window``."""
    m = transformers_mask([10], 21, 3)[0]
    assert m.nonzero().flatten().tolist() == [7, 8, 9, 10, 11, 12, 13]


def test_refusals_name_the_option():
    q, kv, qsl, lens, bt, _, _ = build((0, 8), 8, 2, 2, 8, 4, None)
    with pytest.raises(NotImplementedError, match="bidirectional_window is implemented for non-causal"):
        paged_attention_ref(q, kv, qsl, lens, bt, 0.3, causal=True, bidirectional_window=2)
    with pytest.raises(ValueError, match="sliding_window=4 and bidirectional_window=2 are both set"):
        AttentionOptions(sliding_window=4, bidirectional_window=2)
    with pytest.raises(ValueError, match=r"bidirectional_window=-1: expected None or an int >= 0"):
        AttentionOptions(bidirectional_window=-1)
    assert AttentionOptions(bidirectional_window=2).features() == {"bidirectional_window"}


def test_triton_backend_refuses_the_layer_at_construction():
    model = nn.Module()
    model.local = Attention(2, 2, 8, 0.3, bidirectional_window=4)
    assert "bidirectional_window" not in TritonPagedAttention.attention_features
    with pytest.raises(UnsupportedError, match=r"attention layer local uses bidirectional_window, which attention "
                                               r"backend 'triton' does not implement"):
        check_model_fits(TritonPagedAttention, model, "Enc")
    check_model_fits(TorchPagedAttention, model, "Enc")  # the reference implements it


def test_window_layer_keeps_every_block():
    """The cache spec of a windowed encoder layer carries no window: nothing is freed early."""
    spec = Attention(2, 2, 8, 0.3, bidirectional_window=4).kv_cache_spec("l0", torch.float32)
    assert spec.sliding_window is None and spec.features == {"bidirectional_window"}
