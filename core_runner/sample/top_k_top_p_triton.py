"""Sampling under top-k / top-p / min-p without sorting the vocabulary (Triton twin of
``top_k_top_p.top_k_top_p_threshold_ref`` followed by ``gumbel.gumbel_sample_ref``; the
definitions and the tie rule are documented in ``top_k_top_p.py``).

Launches, each through ``kernel[grid](...)`` with a grid from host ints; nothing of size
batch x vocab and no host sync (which rows need more work stays on the device), so a call
is CUDA-graph capturable. This module holds the read, the decide and the launcher; the
split fallback's kernels are in ``cut_fallback_triton.py``, the threshold search and a
flagged row's state layout, which both use, in ``cut_search_triton.py``:

1. read, grid (rows, S parts): each program streams its contiguous part in tiles of BLOCK
   columns (x = logit * inv_temp, the next tile's load in flight). Each row picks its mode on
   the device: greedy rows take the argmax, rows without a cut the Gumbel-Max draw
   (``gumbel_pass``), and rows with a cut gather statistics and no noise: per lane (column
   mod BLOCK) the two largest values with their columns, the third largest a3, and the mass
   sum(exp(x - lane max)) at one exp a token. At the end the program reads again, in full,
   the lane w holding its largest a3 (~V / (S * BLOCK) columns, from L2), so its bound c is
   the largest a3 of the other lanes: a token x > c is in its lane's list (else that lane's
   a3 would be >= x > c) or in lane w. It hands over its max, its mass, the cut c and the
   entries above it, at most PCAP: when more lie above, c is raised by a few halvings.
2. decide, one program per row: draw-mode rows combine their parts' tokens. Cut rows combine
   the parts' max m and mass Z and take G = the largest cut: the entries above G are exactly
   the row's upper set {x > G} (each of its tokens is above its own part's cut). The S * PCAP
   entries are sorted (the candidates above G come first) and the threshold is read off them
   as the reference reads it off the sorted row: v_k, t_min = m + log(min_p),
   b = max(t_min, v_k), the mass of x >= b (Z when b = -inf, else the candidates') and v_p.
   When the threshold lies above G the nucleus is inside the candidates, and the token is
   the argmax of x + noise over the candidates at or above it (the noise recomputed from the
   column, ties to the smallest column). Otherwise the row is flagged: appended to a device
   list (an atomic slot) with the state its next step starts from.
3. split fallback, ROUNDS launches of one kernel: a fixed grid of programs takes the work
   items (flagged row, CHUNK columns) in turn, so rows not flagged cost nothing but the
   launch. Each item does its row's current step over its chunk and writes per-chunk partial
   results; the last item of a row to finish (an atomic count per row, after a barrier) sums
   the chunks in chunk order (the same sums whatever the batch) and moves the row on:
   - search (top-k's v_k, then top-p's v_p: the largest v whose count / mass of x >= v
     reaches the target, holding at key kl and failing at key kh): the count and mass of
     x >= each of PIVOTS pivots spread over the bracket narrow it (only tiles with tokens
     inside pay the compares); once it holds at most CAP tokens a collect step appends them
     (atomic slots, any order) to the row's CAP slots, and halvings of the keys over them
     give the answer: the largest key where the condition holds is a token's value. A top-p
     search starts at max(b, m + log((1 - p) z / (e V))), z = Z when b = -inf, else 1: the
     tokens below hold less than (1 - p) / e of the mass; after a top-k collect whose kept
     tokens fit the slots it collects them at once. The top-p collect step also draws over
     the tokens above the bracket (all kept): the finisher draws among those and the
     bracket's tokens at or above the threshold.
   - stats (top-k beyond the sorted entries: no floor for v_k): finite count, smallest value.
   - draw (threshold known, e.g. min-p below G): a masked Gumbel pass per chunk, combined.
4. serial last resort, one program per row, returning at once unless the row is still
   unsettled after ROUNDS: the exact threshold by ``row_threshold`` (the same search in one
   program, a pass a round), then a masked Gumbel pass. ``top_k_top_p_threshold_triton``
   runs it on every row.

Which rows flag, and their rounds: flat rows (N(0, 1) logits at temperature 0.7, top-p 0.9: a
nucleus of ~70-90k tokens; 3 rounds), a nucleus wider than the candidates (~200-600 tokens:
randn * 3 logits, about half the rows; 2 rounds), min-p below G (1 round), top-k beyond the
candidates (3 rounds from the sorted entries, 4 from the stats step; with top-p as well it
can need 5 and end in the last resort). The benchmark's peaked rows (N(0, 4^2) logits at temperature 0.7, top-p
0.9: a nucleus of ~39 tokens, at most ~190) do not flag: without the lane read again, a lane
holding three nucleus tokens put G at or above the threshold (~2-6 rows in 1,024, each a serial
tail of several passes). There the read is the only pass over the logits; its entries add
~S * PCAP * 8 bytes a row of stores.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_runner.sample.cut_fallback_triton import (
    _fallback_kernel,
    _round_kernel,
)
from core_runner.sample.cut_search_triton import (
    _B,
    _CHI,
    _DONE,
    _FHI,
    _FLT_MAX,
    _K_PIVOT,
    _KH,
    _KL,
    _M,
    _NC,
    _NSF,
    _NSI,
    _PH,
    _STATS,
    _Z,
    _key,
    _start_after_k,
)
from core_runner.sample.gumbel_triton import (
    _BIG,
    argmax_pass,
    col_hash,
    combine_part_tokens,
    gumbel_noise,
    gumbel_pass,
    row_keys,
    use_fast_log,
)

# tuning: programs per row in the read (_PARTS) and columns per tile there (_BLOCK; S * BLOCK
# lanes: fewer lanes hold three nucleus tokens in one lane more often); entries a part hands to
# the decide (_PCAP; the decide sorts _PARTS * _PCAP, and a nucleus over ~_PCAP tokens of one
# part flags); pivots a search round counts (_PIVOTS); bracket tokens a search collects (_CAP;
# larger: one pivot round less on flat rows); the split fallback's columns per work item
# (_CHUNK, a power of two) and its launches before the serial last resort (_ROUNDS: each costs
# a launch even when no row is flagged)
_PARTS = 8
_BLOCK = 512
_PCAP = 64
_PIVOTS = 16
_CAP = 2048
_CHUNK = 2048
_ROUNDS = 4
_TILE = 256  # tile of the fallback's passes (their pivot compares are [tile, pivots])
_LOG2E = tl.constexpr(1.4426950408889634)
@triton.jit
def _has_cut(k, p, lmp, vocab):
    return ((k > 0) & (k < vocab)) | (p < 1.0) | (lmp > -float("inf"))


@triton.jit
def _count_above(b1, b2, xw, c):
    """Entries above c: the lists b1, b2 (-inf for the lane read again) and its values xw."""
    return tl.sum((b1 > c).to(tl.int32) + (b2 > c).to(tl.int32) + (xw > c).to(tl.int32), axis=0)


@triton.jit
def _part_entries(row, lo, hi, inv_t, o, a1, a2, a3, c1, c2, z, pmax_ptr, pmass_ptr, pcut_ptr, pcnt_ptr, lv_ptr,
                  lc_ptr, BLOCK: tl.constexpr, PCAP: tl.constexpr):
    """A cut row's part, after its pass: max, mass, and the <= PCAP entries above its cut."""
    lanes = tl.arange(0, BLOCK)
    m = tl.max(a1, axis=0)
    ms = tl.where(m > -float("inf"), m, 0.0)
    tl.store(pmax_ptr + o, m)
    tl.store(pmass_ptr + o, tl.sum(z * tl.math.exp2((a1 - ms) * _LOG2E), axis=0))
    # the lane w with the largest third value is read again in full (one column per element,
    # from L2), its lists left out: the part's bound is then the largest third value of the others
    w = tl.min(tl.where(a3 == tl.max(a3, axis=0), lanes, BLOCK), axis=0)
    other = lanes != w
    c = tl.max(tl.where(other, a3, -float("inf")), axis=0)
    b1 = tl.where(other, a1, -float("inf"))
    b2 = tl.where(other, a2, -float("inf"))
    cw = lo + w + lanes * BLOCK
    xw = tl.load(row + cw, mask=cw < hi, other=-float("inf")).to(tl.float32) * inv_t
    if _count_above(b1, b2, xw, c) > PCAP:
        # raise the cut until at most PCAP entries lie above: halvings of [max(c, m - 32), m]
        # (none lies above m); only a bound is needed, so a few halvings do
        lo_c = tl.maximum(c, m - 32.0)
        hi_c = m
        for _ in range(6):
            mid = lo_c + (hi_c - lo_c) * 0.5
            fits = _count_above(b1, b2, xw, mid) <= PCAP
            lo_c = tl.where(fits, lo_c, mid)
            hi_c = tl.where(fits, mid, hi_c)
        c = hi_c
    tl.store(pcut_ptr + o, c)
    # a lane's entries (list 1, list 2, the value read again) go after those of the lanes below
    s1 = (b1 > c).to(tl.int32)
    s2 = (b2 > c).to(tl.int32)
    s3 = (xw > c).to(tl.int32)
    n = s1 + s2 + s3
    at = o.to(tl.int64) * PCAP + tl.cumsum(n, axis=0) - n
    tl.store(lv_ptr + at, b1, mask=s1 > 0)
    tl.store(lc_ptr + at, c1, mask=s1 > 0)
    tl.store(lv_ptr + at + s1, b2, mask=s2 > 0)
    tl.store(lc_ptr + at + s1, c2, mask=s2 > 0)
    tl.store(lv_ptr + at + s1 + s2, xw, mask=s3 > 0)
    tl.store(lc_ptr + at + s1 + s2, cw, mask=s3 > 0)
    tl.store(pcnt_ptr + o, tl.sum(n, axis=0))


@triton.jit
def _read_kernel(logits_ptr, s_row, inv_t_ptr, k_ptr, p_ptr, lmp_ptr, seed_ptr, pos_ptr, nflag_ptr, tok_ptr, pmax_ptr,
                 pmass_ptr, pcut_ptr, pcnt_ptr, lv_ptr, lc_ptr, vocab, part, FAST_LOG: tl.constexpr,
                 BLOCK: tl.constexpr, PCAP: tl.constexpr):
    i = tl.program_id(0)
    s = tl.program_id(1)
    o = i * tl.num_programs(1) + s
    if o == 0:
        tl.store(nflag_ptr, 0)  # the decide appends its flagged rows from slot 0
    row = logits_ptr + i.to(tl.int64) * s_row
    lo = s * part
    hi = tl.minimum(lo + part, vocab)
    inv_t = tl.load(inv_t_ptr + i)
    if inv_t == 0:
        tl.store(tok_ptr + o, argmax_pass(row, hi, BLOCK, lo))
    elif not _has_cut(tl.load(k_ptr + i), tl.load(p_ptr + i), tl.load(lmp_ptr + i), vocab):
        k1, k2 = row_keys(seed_ptr, pos_ptr, i)
        tl.store(tok_ptr + o, gumbel_pass(row, hi, inv_t, 0.0, k1, k2, False, FAST_LOG, BLOCK, lo))
    else:
        lanes = tl.arange(0, BLOCK)
        a1 = tl.full([BLOCK], -float("inf"), tl.float32)
        a2 = a1
        a3 = a1
        c1 = lo + lanes
        c2 = c1
        z = tl.zeros([BLOCK], tl.float32)  # the lane's mass relative to its max a1
        nxt = tl.load(row + lo + lanes, mask=lo + lanes < hi, other=-float("inf"))
        for start in range(lo, hi, BLOCK):
            cols = start + lanes
            x = nxt.to(tl.float32) * inv_t
            # the next tile's load is in flight while this one is sorted into the lists
            nxt = tl.load(row + BLOCK + cols, mask=cols + BLOCK < hi, other=-float("inf"))
            gt1 = x > a1
            gt2 = x > a2
            a3 = tl.where(gt2, a2, tl.maximum(a3, x))
            a2 = tl.where(gt1, a1, tl.where(gt2, x, a2))
            c2 = tl.where(gt1, c1, tl.where(gt2, cols, c2))
            # one exp a token: exp(-|x - a1|) rescales z (new max) or is the token's share; the
            # clamp keeps -inf - -inf (a lane of -inf so far) out
            t = tl.math.exp2(-tl.abs(x - tl.maximum(a1, -_FLT_MAX)) * _LOG2E)
            z = tl.where(gt1, z * t + 1.0, z + t)
            a1 = tl.where(gt1, x, a1)
            c1 = tl.where(gt1, cols, c1)
        _part_entries(row, lo, hi, inv_t, o, a1, a2, a3, c1, c2, z, pmax_ptr, pmass_ptr, pcut_ptr, pcnt_ptr, lv_ptr,
                      lc_ptr, BLOCK, PCAP)


@triton.jit
def _decide_kernel(logits_ptr, s_row, inv_t_ptr, k_ptr, p_ptr, lmp_ptr, seed_ptr, pos_ptr, tok_ptr, pmax_ptr,
                   pmass_ptr, pcut_ptr, pcnt_ptr, lv_ptr, lc_ptr, out_ptr, thr_ptr, flag_ptr, si_ptr, sf_ptr,
                   flist_ptr, nflag_ptr, done_ptr, fill_ptr, vocab, n_parts, FAST_LOG: tl.constexpr,
                   P: tl.constexpr, PCAP: tl.constexpr, CAP: tl.constexpr):
    i = tl.program_id(0)
    row = logits_ptr + i.to(tl.int64) * s_row
    si = si_ptr + i * _NSI
    sf = sf_ptr + i * _NSF
    inv_t = tl.load(inv_t_ptr + i)
    k = tl.load(k_ptr + i)
    p = tl.load(p_ptr + i)
    lmp = tl.load(lmp_ptr + i)
    k1, k2 = row_keys(seed_ptr, pos_ptr, i)
    flag = 0
    thr = -float("inf")
    tok = tl.zeros([], tl.int64)
    if (inv_t == 0) | (not _has_cut(k, p, lmp, vocab)):
        tok = combine_part_tokens(row, tok_ptr + i * n_parts, n_parts, inv_t, 0.0, k1, k2, False, FAST_LOG, P)
    else:
        offs = tl.arange(0, P)
        ok = offs < n_parts
        pm = tl.load(pmax_ptr + i * n_parts + offs, mask=ok, other=-float("inf"))
        m = tl.max(pm, axis=0)
        ms = tl.where(m > -float("inf"), m, 0.0)
        z = tl.sum(tl.load(pmass_ptr + i * n_parts + offs, mask=ok, other=0.0) * tl.exp(pm - ms), axis=0)
        g = tl.max(tl.load(pcut_ptr + i * n_parts + offs, mask=ok, other=-float("inf")), axis=0)
        # every part's entries, sorted: the candidates {x > G} come first
        j = tl.arange(0, P * PCAP)
        s = j // PCAP
        valid = (s < n_parts) & (j % PCAP < tl.load(pcnt_ptr + i * n_parts + s, mask=s < n_parts, other=0))
        at = (i * n_parts).to(tl.int64) * PCAP + j
        v = tl.load(lv_ptr + at, mask=valid, other=-float("inf"))
        c = tl.load(lc_ptr + at, mask=valid, other=0)
        srt = tl.sort(v, dim=0, descending=True)
        n_st = tl.sum(valid.to(tl.int32), axis=0)
        n_c = tl.sum((v > g).to(tl.int32), axis=0)
        # the reference's threshold, read off the sorted candidates (G = -inf: they are every
        # finite token, so a top-k beyond them is no cut)
        b = m + lmp
        k_on = (k > 0) & (k < vocab)
        k_open = k_on & (k > n_c) & (g > -float("inf"))
        if k_on & (k <= n_c):
            b = tl.maximum(b, tl.max(tl.where(j == k - 1, srt, -float("inf")), axis=0))
        thr = b
        settled = ~k_open
        if p < 1.0:
            in_b = (j < n_c) & (srt >= b)
            ex = tl.where(in_b, tl.exp(srt - ms), 0.0)
            z_b = tl.where(b > -float("inf"), tl.sum(ex, axis=0), z)
            cum = tl.cumsum(ex, axis=0)
            first = tl.sum((in_b & (cum < p * z_b)).to(tl.int32), axis=0)
            settled = settled & ((b == -float("inf")) | (b > g)) & (first < tl.sum(in_b.to(tl.int32), axis=0))
            thr = tl.maximum(b, tl.max(tl.where(j == first, srt, -float("inf")), axis=0))
        if m == -float("inf"):
            thr = -float("inf")  # nothing finite: the reference's argmax of -inf is column 0
        elif settled & (thr > g):
            keep = valid & (v >= thr)
            noisy = tl.where(keep, v + gumbel_noise(col_hash(c), k1, k2, FAST_LOG), -float("inf"))
            top = tl.max(noisy, axis=0)
            tok = tl.min(tl.where(keep & (noisy == top), c, _BIG), axis=0).to(tl.int64)
        else:
            flag = 1
            tl.store(sf + _M, m)
            tl.store(sf + _Z, z)
            tl.store(done_ptr + i, 0)
            tl.store(fill_ptr + i, 0)
            tl.store(flist_ptr + tl.atomic_add(nflag_ptr, 1), i)
            if k_open:
                # v_k <= G (fewer than k tokens above it); the k-th sorted entry is a floor when
                # there is one, else the stats step finds the smallest finite value
                tl.store(sf + _B, m + lmp)
                tl.store(sf + _FHI, 0.0)  # (top-k counts; the mass is unused)
                tl.store(si + _KH, (_key(g) + 1).to(tl.int32))
                tl.store(si + _CHI, n_c)
                tl.store(si + _NC, n_c)
                if k <= n_st:
                    tl.store(si + _PH, _K_PIVOT)
                    tl.store(si + _KL, _key(tl.max(tl.where(j == k - 1, srt, -float("inf")), axis=0)).to(tl.int32))
                else:
                    tl.store(si + _PH, _STATS)
            else:
                _start_after_k(si, sf, fill_ptr + i, p, m, b, CAP + 1, vocab, CAP)
    if flag == 0:
        tl.store(si + _PH, _DONE)
        tl.store(thr_ptr + i, thr)
    tl.store(out_ptr + i, tok)
    tl.store(flag_ptr + i, flag)


def _settings(logits, inv_temp, top_k, top_p, log_min_p):
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    return (logits, logits.stride(0), inv_temp.float().contiguous(), top_k.to(torch.int32).contiguous(),
            top_p.float().contiguous(), log_min_p.float().contiguous())


def _num_programs(dev: torch.device) -> int:
    """The split fallback's grid: two programs per SM on a GPU (as many as fit; they loop over the items)."""
    if dev.type == "cuda":
        return 2 * torch.cuda.get_device_properties(dev).multi_processor_count
    return 4


def _cut_sample(logits, inv_temp, seeds, positions, top_k, top_p, log_min_p, block, parts, pcap, cap, chunk, rounds):
    """(tokens, flags, thresholds, state steps) of ``cut_sample_triton``."""
    n, vocab = logits.shape
    dev = logits.device
    i32, f32 = torch.int32, torch.float32
    out = torch.empty(n, dtype=torch.int64, device=dev)
    flag = torch.empty(n, dtype=i32, device=dev)
    thr = torch.empty(n, dtype=f32, device=dev)
    si = torch.empty((n, _NSI.value), dtype=i32, device=dev)
    if n == 0:
        return out, flag, thr, si[:, 0]
    assert chunk & (chunk - 1) == 0, "chunk must be a power of two"
    args = _settings(logits, inv_temp, top_k, top_p, log_min_p) + (seeds.contiguous(), positions.contiguous())
    part = triton.cdiv(triton.cdiv(vocab, parts), block) * block
    assert part <= block * block, "a lane read again must fit one tile: raise block or parts"
    s = triton.cdiv(vocab, part)
    n_chunks = triton.cdiv(vocab, chunk)
    w = _PIVOTS + 3
    # scratch, carved from one int32 and one float32 buffer
    ints = torch.empty(1 + 3 * n + n * s * (2 + pcap) + n * n_chunks * w + n * cap, dtype=i32, device=dev)
    floats = torch.empty(n * s * (3 + pcap) + n * _NSF.value + n * n_chunks * w + n * cap, dtype=f32, device=dev)
    ints_at = [1, n, n, n, n * s, n * s, n * s * pcap, n * n_chunks * w, n * cap]
    nflag, flist, done, fill, tok, pcnt, lc, qi, cc = torch.split(ints, ints_at)
    pmax, pmass, pcut, lv, sf, qf, cv = torch.split(floats, [n * s, n * s, n * s, n * s * pcap, n * _NSF.value,
                                                             n * n_chunks * w, n * cap])
    fast = use_fast_log(dev)
    stats = (tok, pmax, pmass, pcut, pcnt, lv, lc)
    _read_kernel[(n, s)](*args, nflag, *stats, vocab, part, FAST_LOG=fast, BLOCK=block, PCAP=pcap)
    _decide_kernel[(n,)](*args, *stats, out, thr, flag, si, sf, flist, nflag, done, fill, vocab, s, FAST_LOG=fast,
                         P=triton.next_power_of_2(s), PCAP=pcap, CAP=cap)
    inv_t, k, p = args[2], args[3], args[4]
    for _ in range(rounds):
        _round_kernel[(_num_programs(dev),)](args[0], args[1], inv_t, k, p, args[6], args[7], flist, nflag, si, sf, qi,
                                            qf, cv, cc, fill, done, out, thr, vocab, n_chunks, FAST_LOG=fast,
                                            CHUNK=chunk, TILE=min(_TILE, chunk), NP=_PIVOTS, CAP=cap,
                                            NCH=triton.next_power_of_2(n_chunks), num_warps=8)
    _fallback_kernel[(n,)](*args, si, cv, out, thr, vocab, FAST_LOG=fast, DRAW=True, BLOCK=block, NP=_PIVOTS,
                           CAP=cap)
    return out, flag, thr, si[:, 0]


def cut_sample_triton(
    logits: torch.Tensor, inv_temp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
    top_k: torch.Tensor, top_p: torch.Tensor, log_min_p: torch.Tensor, *, block: int = _BLOCK,
    parts: int = _PARTS, pcap: int = _PCAP, cap: int = _CAP, chunk: int = _CHUNK, rounds: int = _ROUNDS,
    with_flags: bool = False, details: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """[n, V] logits -> [n] int64 tokens, exactly those of the reference (up to float rounding
    of sums); any mix of greedy rows, rows without a cut and rows with one. ``with_flags``
    also returns which rows the decide flagged ([n] int32, 0 / 1). ``details`` returns
    (tokens, flags, thresholds, steps): each row's threshold on x (-inf: no cut) and its
    final step (0: settled by the decide or the split fallback, 7: by the serial last resort)."""
    res = _cut_sample(logits, inv_temp, seeds, positions, top_k, top_p, log_min_p, block, parts, pcap, cap, chunk,
                      rounds)
    if details:
        return res
    return (res[0], res[1]) if with_flags else res[0]


def top_k_top_p_threshold_triton(
    logits: torch.Tensor, inv_temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
    log_min_p: torch.Tensor, block: int = _BLOCK, cap: int = _CAP,
) -> torch.Tensor:
    """Same contract as ``top_k_top_p_threshold_ref``: [n, V] -> [n] float32 thresholds
    (the serial last resort's search on every row; for tests)."""
    n, vocab = logits.shape
    dev = logits.device
    thr = torch.empty(n, dtype=torch.float32, device=dev)
    if n:
        args = _settings(logits, inv_temp, top_k, top_p, log_min_p)
        si = torch.full((n, _NSI.value), _STATS.value, dtype=torch.int32, device=dev)
        cx = torch.empty((n, cap), dtype=torch.float32, device=dev)
        _fallback_kernel[(n,)](*args, si, si, si, cx, thr, thr, vocab, FAST_LOG=False, DRAW=False,
                               BLOCK=block, NP=_PIVOTS, CAP=cap)
    return thr
