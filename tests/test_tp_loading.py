"""Loading checkpoints by region: a tensor-parallel rank reads only the rows or columns it
keeps (safetensors' get_slice), fp8 weights are dequantized with only the block scales
that cover that region, and what each rank holds equals its slice of the TP=1 weights.

Ranks are simulated in-process: layers read the TP group when they are built, so a
model built while ``set_tp_group(GroupCoordinator(rank=r, world_size=n))`` is installed
holds rank r's parameters. ``safetensors.safe_open`` is wrapped to record every region
read, so the tests assert on what left the file, not only on what was kept.
"""
from __future__ import annotations

import json
import re
from contextlib import contextmanager
from pathlib import Path

import pytest
import safetensors
import torch
from safetensors.torch import save_file
from torch import nn

from core_runner.distributed import GroupCoordinator, set_tp_group
from core_runner.layers import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from core_runner.loader import CheckpointError, CheckpointSlice, load_weights
from core_runner.loader.weights import accepts_slices
from core_runner.quantization import Fp8BlockQuantization, dequantize_fp8_block, quantize_fp8_block

VOCAB, HIDDEN, HEADS, HEAD_SIZE, INTER, COL = 37, 24, 4, 6, 40, 36
# fp8 blocks that no rank split of the sizes above aligns to: partial blocks on both axes
BLOCK = (16, 16)
REAL_SAFE_OPEN = safetensors.safe_open


class Tiny(nn.Module):
    """One of each split layer, under the names a Hugging Face checkpoint uses."""

    packed_modules_mapping = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
                              "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def __init__(self, kv_heads: int) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(VOCAB, HIDDEN)
        self.qkv_proj = QKVParallelLinear(HIDDEN, HEAD_SIZE, HEADS, kv_heads, bias=True)
        self.o_proj = RowParallelLinear(HEADS * HEAD_SIZE, HIDDEN, bias=True)
        self.gate_up_proj = MergedColumnParallelLinear(HIDDEN, [INTER, INTER])
        self.down_proj = RowParallelLinear(INTER, HIDDEN)
        self.col = ColumnParallelLinear(HIDDEN, COL, bias=True)
        self.w13 = MergedColumnParallelLinear(HIDDEN, [INTER, INTER])  # stored fused: loaded with shard None
        self.lm_head = ParallelLMHead(VOCAB, HIDDEN)
        self.norm = nn.Parameter(torch.empty(HIDDEN), requires_grad=False)  # no weight_loader


def checkpoint_tensors(kv_heads: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    kv = kv_heads * HEAD_SIZE
    return {
        "embed_tokens.weight": rand(VOCAB, HIDDEN), "q_proj.weight": rand(HEADS * HEAD_SIZE, HIDDEN),
        "q_proj.bias": rand(HEADS * HEAD_SIZE), "k_proj.weight": rand(kv, HIDDEN), "k_proj.bias": rand(kv),
        "v_proj.weight": rand(kv, HIDDEN), "v_proj.bias": rand(kv), "o_proj.weight": rand(HIDDEN, HEADS * HEAD_SIZE),
        "o_proj.bias": rand(HIDDEN), "gate_proj.weight": rand(INTER, HIDDEN), "up_proj.weight": rand(INTER, HIDDEN),
        "down_proj.weight": rand(HIDDEN, INTER), "col.weight": rand(COL, HIDDEN), "col.bias": rand(COL),
        "w13.weight": rand(2 * INTER, HIDDEN), "lm_head.weight": rand(VOCAB, HIDDEN), "norm": rand(HIDDEN),
    }


def write(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


def write_fp8(path: Path, tensors: dict[str, torch.Tensor]) -> tuple[Path, dict[str, torch.Tensor]]:
    """DeepSeek-V3's format: 2-D weights as float8_e4m3fn beside '<name>_scale_inv', the
    embedding, LM head, biases and norm as float32; scales in the other shard file than
    their weight. Returns the path and the dequantized values."""
    path.mkdir(parents=True)
    shards: list[dict[str, torch.Tensor]] = [{}, {}]
    dequantized = {}
    for i, (name, w) in enumerate(sorted(tensors.items())):
        if w.dim() != 2 or re.match(r"(embed_tokens|lm_head)\.", name):
            shards[i % 2][name] = dequantized[name] = w
            continue
        q, scale = quantize_fp8_block(w, BLOCK)
        shards[i % 2][name], shards[(i + 1) % 2][name + "_scale_inv"] = q, scale
        dequantized[name] = dequantize_fp8_block(q, scale, BLOCK)
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        save_file(shard, str(path / file))
        weight_map.update({k: file for k in shard})
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return path, dequantized


@contextmanager
def as_rank(rank: int, size: int):
    prev = set_tp_group(GroupCoordinator(rank=rank, world_size=size))
    try:
        yield
    finally:
        set_tp_group(prev)


class Reads:
    """Every region read through safetensors while installed: (tensor, bounds) with bounds
    [(start, stop), ...] over the whole tensor for a whole read, and the bytes read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.regions: list[tuple[str, tuple[tuple[int, int], ...]]] = []
        self.bytes = 0
        reads = self

        class File:
            def __init__(self, filename, framework, device="cpu"):
                self._f = REAL_SAFE_OPEN(filename, framework=framework, device=device)

            def __enter__(self):
                self._f.__enter__()
                return self

            def __exit__(self, *exc):
                return self._f.__exit__(*exc)

            def keys(self):
                return self._f.keys()

            def get_tensor(self, name):
                t = self._f.get_tensor(name)
                reads.record(name, tuple((0, n) for n in t.shape), t)
                return t

            def get_slice(self, name):
                return Slice(self._f.get_slice(name), name)

        class Slice:
            def __init__(self, raw, name):
                self._raw, self._name = raw, name

            def get_shape(self):
                return self._raw.get_shape()

            def get_dtype(self):
                return self._raw.get_dtype()

            def __getitem__(self, key):
                t = self._raw[key]
                key = key if isinstance(key, tuple) else (key,)
                reads.record(self._name, tuple((k.start or 0, k.stop) for k in key), t)
                return t

        monkeypatch.setattr(safetensors, "safe_open", File)

    def record(self, name: str, bounds: tuple[tuple[int, int], ...], t: torch.Tensor) -> None:
        self.regions.append((name, bounds))
        self.bytes += t.numel() * t.element_size()

    def of(self, name: str) -> list[tuple[tuple[int, int], ...]]:
        return [b for n, b in self.regions if n == name]


def chunk(n: int, rank: int, tp: int) -> tuple[int, int]:
    return rank * n // tp, (rank + 1) * n // tp


def kv_rows(kv_heads: int, rank: int, tp: int) -> tuple[int, int]:
    """Checkpoint rows of k/v that rank ``rank`` keeps: its 1/tp of the heads, or, with more
    ranks than KV heads, the one head it shares with tp / kv_heads - 1 other ranks."""
    if tp <= kv_heads:
        return chunk(kv_heads * HEAD_SIZE, rank, tp)
    head = rank * kv_heads // tp
    return head * HEAD_SIZE, (head + 1) * HEAD_SIZE


def expected_regions(kv_heads: int, rank: int, tp: int) -> dict[str, list]:
    """What rank ``rank`` of ``tp`` must read of each checkpoint tensor, worked out here
    from how each layer splits (vLLM's scheme), not from the layers' code."""
    rows_per = -(-VOCAB // tp)
    vocab = (rank * rows_per, min((rank + 1) * rows_per, VOCAB))
    whole_h, q_rows, kv = (0, HIDDEN), chunk(HEADS * HEAD_SIZE, rank, tp), kv_rows(kv_heads, rank, tp)
    gate_rows = chunk(INTER, rank, tp)
    return {
        "embed_tokens.weight": [(vocab, whole_h)], "lm_head.weight": [(vocab, whole_h)],
        "q_proj.weight": [(q_rows, whole_h)], "q_proj.bias": [(q_rows,)],
        "k_proj.weight": [(kv, whole_h)], "k_proj.bias": [(kv,)], "v_proj.weight": [(kv, whole_h)],
        "v_proj.bias": [(kv,)],
        "o_proj.weight": [(whole_h, chunk(HEADS * HEAD_SIZE, rank, tp))], "o_proj.bias": [(whole_h,)],
        "gate_proj.weight": [(gate_rows, whole_h)], "up_proj.weight": [(gate_rows, whole_h)],
        "down_proj.weight": [(whole_h, chunk(INTER, rank, tp))],
        "col.weight": [(chunk(COL, rank, tp), whole_h)], "col.bias": [(chunk(COL, rank, tp),)],
        "w13.weight": [(gate_rows, whole_h), ((INTER + gate_rows[0], INTER + gate_rows[1]), whole_h)],
        "norm": [(whole_h,)],
    }


def rank_view(name: str, full: torch.Tensor, kv_heads: int, rank: int, tp: int) -> torch.Tensor:
    """Rank ``rank``'s value of TP=1 parameter ``name`` (padding rows of the vocabulary zero)."""
    if name in ("embed_tokens.weight", "lm_head.weight"):
        rows_per = -(-VOCAB // tp)
        out = torch.zeros(rows_per, HIDDEN)
        mine = full[rank * rows_per: (rank + 1) * rows_per]
        out[: mine.shape[0]] = mine
        return out
    if name.startswith("qkv_proj."):
        q, kv = HEADS * HEAD_SIZE, kv_heads * HEAD_SIZE
        a, b = chunk(q, rank, tp)
        ka, kb = kv_rows(kv_heads, rank, tp)
        return torch.cat([full[a:b], full[q + ka: q + kb], full[q + kv + ka: q + kv + kb]])
    if name in ("gate_up_proj.weight", "w13.weight"):
        a, b = chunk(INTER, rank, tp)
        return torch.cat([full[a:b], full[INTER + a: INTER + b]])
    if name in ("o_proj.weight", "down_proj.weight"):
        a, b = chunk(full.shape[1], rank, tp)
        return full[:, a:b]
    if name in ("col.weight", "col.bias"):
        a, b = chunk(COL, rank, tp)
        return full[a:b]
    return full  # replicated: o_proj.bias, norm


def load_tiny(path: Path, kv_heads: int, rank: int = 0, tp: int = 1, **kw) -> dict[str, torch.Tensor]:
    with as_rank(rank, tp):
        model = Tiny(kv_heads)
        load_weights(model, path, **kw)
    return {k: v.detach().clone() for k, v in model.named_parameters()}


SPLITS = [(2, 2), (4, 2), (4, 1), (2, 4)]  # (tp, kv heads): (4, 2) and (4, 1) replicate KV heads


# ---------------------------------------------------------------------------------
# what a rank reads, and what it keeps
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tp, kv_heads", SPLITS)
def test_each_rank_reads_only_its_region(tmp_path, monkeypatch, tp, kv_heads):
    path = write(tmp_path / "ckpt", checkpoint_tensors(kv_heads))
    whole_bytes = sum(t.numel() * 4 for t in checkpoint_tensors(kv_heads).values())
    for rank in range(tp):
        reads = Reads(monkeypatch)
        load_tiny(path, kv_heads, rank, tp)
        want = expected_regions(kv_heads, rank, tp)
        assert {n for n, _ in reads.regions} == set(want), rank
        for name, regions in want.items():
            assert reads.of(name) == regions, (rank, name)
        want_bytes = sum(4 * _numel(b) for regions in want.values() for b in regions)
        assert reads.bytes == want_bytes < whole_bytes, (rank, reads.bytes, whole_bytes)


def _numel(bounds) -> int:
    n = 1
    for a, b in bounds:
        n *= b - a
    return n


@pytest.mark.parametrize("tp, kv_heads", SPLITS)
def test_rank_parameters_are_their_slices_of_the_tp1_weights(tmp_path, tp, kv_heads):
    path = write(tmp_path / "ckpt", checkpoint_tensors(kv_heads))
    full = load_tiny(path, kv_heads)
    assert torch.equal(full["qkv_proj.weight"][: HEADS * HEAD_SIZE], checkpoint_tensors(kv_heads)["q_proj.weight"])
    ranks = [load_tiny(path, kv_heads, r, tp) for r in range(tp)]
    for name, value in full.items():
        for r, params in enumerate(ranks):
            assert torch.equal(params[name], rank_view(name, value, kv_heads, r, tp)), (name, r)
    # the split layers' rank slices put back together are the whole weights
    assert torch.equal(torch.cat([p["col.weight"] for p in ranks]), full["col.weight"])
    assert torch.equal(torch.cat([p["o_proj.weight"] for p in ranks], dim=1), full["o_proj.weight"])
    assert torch.equal(torch.cat([p["embed_tokens.weight"] for p in ranks])[:VOCAB], full["embed_tokens.weight"])
    q = HEADS * HEAD_SIZE // tp
    assert torch.equal(torch.cat([p["qkv_proj.weight"][:q] for p in ranks]), full["qkv_proj.weight"][: q * tp])
    pad = -(-VOCAB // tp) * tp - VOCAB  # rows past the vocabulary on the last rank are zero
    assert pad == 0 or (ranks[-1]["lm_head.weight"][-pad:] == 0).all()


# ---------------------------------------------------------------------------------
# fp8 (DeepSeek-V3 block format)
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tp, kv_heads", [(2, 2), (4, 2)])
def test_fp8_rank_gets_its_slice_of_the_dequantized_weights(tmp_path, monkeypatch, tp, kv_heads):
    path, dequantized = write_fp8(tmp_path / "fp8", checkpoint_tensors(kv_heads))
    fp8 = Fp8BlockQuantization(BLOCK)
    full = load_tiny(path, kv_heads, quantization=fp8)
    # TP=1 holds the dequantized values, fp8-rounded (so the test can tell them from the originals)
    assert torch.equal(full["o_proj.weight"], dequantized["o_proj.weight"])
    assert not torch.equal(full["o_proj.weight"], checkpoint_tensors(kv_heads)["o_proj.weight"])
    # no rank's split lands on a block boundary on at least one axis
    assert chunk(HEADS * HEAD_SIZE, 1, tp)[0] % BLOCK[1] and chunk(INTER, 1, tp)[0] % BLOCK[0]
    for rank in range(tp):
        reads = Reads(monkeypatch)
        params = load_tiny(path, kv_heads, rank, tp, quantization=fp8)
        for name, value in full.items():
            assert torch.equal(params[name], rank_view(name, value, kv_heads, rank, tp)), (name, rank)
        # the scales read are the blocks overlapping the rank's region, no more
        a, b = chunk(HEADS * HEAD_SIZE, rank, tp)
        assert reads.of("o_proj.weight") == [((0, HIDDEN), (a, b))]
        assert reads.of("o_proj.weight_scale_inv") == [((0, 2), (a // BLOCK[1], -(-b // BLOCK[1])))]
        ga, gb = chunk(INTER, rank, tp)
        assert reads.of("gate_proj.weight_scale_inv") == [((ga // BLOCK[0], -(-gb // BLOCK[0])), (0, 2))]


def test_checkpoint_slice_narrows_compose_on_any_dim(tmp_path):
    """A 3-D fp8 tensor (stacked experts), narrowed on every dim in turn, dequantizes to
    the same region of the whole dequantized tensor."""
    from core_runner.loader.checkpoint import open_safetensors
    from core_runner.loader.slices import open_checkpoint_slice
    from core_runner.quantization import TensorLookup

    g = torch.Generator().manual_seed(3)
    w = torch.randn(3, 50, 45, generator=g)
    q, scale = quantize_fp8_block(w, BLOCK)
    file = tmp_path / "experts.safetensors"
    save_file({"experts.weight": q, "experts.weight_scale_inv": scale}, str(file))
    whole = dequantize_fp8_block(q, scale, BLOCK)
    param = torch.empty(0, dtype=torch.bfloat16)
    with open_safetensors(file) as f:
        sl = open_checkpoint_slice(f, file, "experts.weight", param, Fp8BlockQuantization(BLOCK), TensorLookup([file]))
        assert isinstance(sl, CheckpointSlice) and sl.shape == (3, 50, 45) and sl.dtype == torch.bfloat16
        view = sl.narrow(0, 1, 2).narrow(-1, 7, 30).narrow(1, 17, 20).narrow(2, 3, 20)
        assert view.shape == (2, 20, 20) and view.bounds == ((1, 3), (17, 37), (10, 30))
        assert "experts.weight'[1:3, 17:37, 10:30]" in repr(view)
        got = view.load()
        assert got.dtype == torch.bfloat16 and torch.equal(got, whole[1:3, 17:37, 10:30].to(torch.bfloat16))
        assert torch.equal(sl.narrow(1, -5, 5).load(), whole[:, 45:].to(torch.bfloat16))  # start from the end
        assert sl.narrow(2, 45, 0).load().shape == (3, 50, 0)
        with pytest.raises(ValueError, match=r"narrow\(dim=1, start=40, length=11\) does not fit shape \(3, 50, "
                                             r"45\): expected -50 <= start and start \+ length <= 50"):
            sl.narrow(1, 40, 11)
        with pytest.raises(ValueError, match=r"narrow\(dim=3\) is out of range .* expected -3 <= dim < 3"):
            sl.narrow(3, 0, 1)


# ---------------------------------------------------------------------------------
# errors still name the file, the tensor and the parameter
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_value_in_a_rank_region_names_file_tensor_and_region(tmp_path, bad):
    tensors = checkpoint_tensors(2)
    tensors["o_proj.weight"][3, 17] = bad  # column 17: rank 1 of 2 reads columns 12..24
    path = write(tmp_path / "ckpt", tensors)
    load_tiny(path, 2, rank=0, tp=2)  # rank 0 never reads the bad value
    kind = "1 NaN and 0 inf" if bad != bad else "0 NaN and 1 inf"
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: tensor 'o_proj\.weight' of shape \(24, 24\) "
                                               rf"\(this rank reads \[0:24, 12:24\]\) holds {kind} values \(the "
                                               r"first at index \(3, 17\)\)"):
        load_tiny(path, 2, rank=1, tp=2)


def test_non_finite_fp8_region_is_caught_after_dequantization(tmp_path):
    tensors = checkpoint_tensors(2)
    path, _ = write_fp8(tmp_path / "fp8", tensors)
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    file = path / index["gate_proj.weight_scale_inv"]
    from safetensors.torch import load_file

    shard = load_file(str(file))
    shard["gate_proj.weight_scale_inv"][2, 0] = float("inf")  # scale block rows 32..40: rank 3 of 4 (30..40)
    save_file(shard, str(file))
    fp8 = Fp8BlockQuantization(BLOCK)
    load_tiny(path, 2, rank=0, tp=4, quantization=fp8)
    with pytest.raises(CheckpointError, match=rf"{re.escape(index['gate_proj.weight'])}: tensor 'gate_proj\.weight' "
                                               r"of shape \(40, 24\) \(this rank reads \[30:40, 0:24\]\) holds "
                                               r"\d+ NaN and \d+ inf values \(the first at index \(32, "):
        load_tiny(path, 2, rank=3, tp=4, quantization=fp8)


def test_fp8_scale_missing_or_misshapen_is_refused_before_any_read(tmp_path, monkeypatch):
    path, _ = write_fp8(tmp_path / "fp8", checkpoint_tensors(2))
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    scale_file = path / index["weight_map"]["down_proj.weight_scale_inv"]
    from safetensors.torch import load_file

    shard = load_file(str(scale_file))
    shard["down_proj.weight_scale_inv"] = torch.ones(2, 2)  # [24, 40] in 16x16 blocks needs (2, 3)
    save_file(shard, str(scale_file))
    reads = Reads(monkeypatch)
    with pytest.raises(CheckpointError, match=r"tensor 'down_proj\.weight': 'down_proj\.weight': scale tensor has "
                                               r"shape \(2, 2\), but weight shape \(24, 40\) with weight_block_size "
                                               r"\[16, 16\] needs \(2, 3\)"):
        load_tiny(path, 2, rank=1, tp=2, quantization=Fp8BlockQuantization(BLOCK))
    assert "down_proj.weight" not in {n for n, _ in reads.regions}
    del shard["down_proj.weight_scale_inv"]
    save_file(shard, str(scale_file))
    del index["weight_map"]["down_proj.weight_scale_inv"]
    index_file.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"'down_proj\.weight' is float8_e4m3fn but its scale "
                                               r"'down_proj\.weight_scale_inv' is not in the checkpoint"):
        load_tiny(path, 2, rank=1, tp=2, quantization=Fp8BlockQuantization(BLOCK))


@pytest.mark.parametrize("name, shape, message", [
    # too few rows, too many rows (rank 1's rows would exist): the layer checks the whole shape
    ("col.weight", (COL - 2, HIDDEN), r"'col\.weight' of shape \(34, 24\) does not fit parameter 'col\.weight' "
                                      r"\(shape \(18, 24\)\): checkpoint tensor has shape \(34, 24\), expected "
                                      r"\(36, 24\)"),
    ("col.weight", (COL + 2, HIDDEN), r"'col\.weight' of shape \(38, 24\) does not fit parameter 'col\.weight' "
                                      r"\(shape \(18, 24\)\): checkpoint tensor has shape \(38, 24\), expected "
                                      r"\(36, 24\)"),
    ("o_proj.weight", (HIDDEN, 20), r"'o_proj\.weight' of shape \(24, 20\) does not fit parameter 'o_proj\.weight' "
                                    r"\(shape \(24, 12\)\): checkpoint tensor has shape \(24, 20\), expected "
                                    r"\(24, 24\)"),
    ("k_proj.weight", (3 * HEAD_SIZE, HIDDEN), r"'k_proj\.weight' of shape \(18, 24\) does not fit parameter "
                                               r"'qkv_proj\.weight' part 'k'"),
])
def test_shape_mismatch_names_file_tensor_and_parameter(tmp_path, name, shape, message):
    tensors = checkpoint_tensors(2)
    tensors[name] = torch.randn(*shape)
    path = write(tmp_path / "ckpt", tensors)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor " + message):
        load_tiny(path, 2, rank=1, tp=2)


# ---------------------------------------------------------------------------------
# who is handed a slice
# ---------------------------------------------------------------------------------
class _Seen(nn.Module):
    """Parameters whose loaders record what they were handed."""

    def __init__(self, seen: dict[str, type]) -> None:
        super().__init__()
        from core_runner.layers import FusedMoE

        self.plain = nn.Parameter(torch.empty(4, 3), requires_grad=False)
        self.flagged = nn.Parameter(torch.empty(2, 3), requires_grad=False)
        self.moe = FusedMoE(2, 3, 4)

        def plugin_loader(param, loaded, shard_id=None):  # a third-party loader: may index the tensor
            seen["plain"] = type(loaded)
            param.data.copy_(loaded[:, :])

        def flagged_loader(param, loaded, shard_id=None):
            seen["flagged"] = type(loaded)
            param.data.copy_(loaded.narrow(0, 2, 2).load())

        flagged_loader.accepts_checkpoint_slices = True
        self.plain.weight_loader, self.flagged.weight_loader = plugin_loader, flagged_loader


def test_only_loaders_that_accept_slices_get_them(tmp_path):
    seen: dict[str, type] = {}
    g = torch.Generator().manual_seed(1)
    tensors = {"plain": torch.randn(4, 3, generator=g), "flagged": torch.randn(4, 3, generator=g),
               "moe.w13.weight": torch.randn(2, 8, 3, generator=g), "moe.w2.weight": torch.randn(2, 3, 4, generator=g)}
    model = _Seen(seen)
    load_weights(model, write(tmp_path / "ckpt", tensors))
    assert seen == {"plain": torch.Tensor, "flagged": CheckpointSlice}
    assert torch.equal(model.plain, tensors["plain"]) and torch.equal(model.flagged, tensors["flagged"][2:])
    assert torch.equal(model.moe.w13.weight, tensors["moe.w13.weight"])  # a stacked tensor, through a slice
    with as_rank(0, 2):
        tiny = Tiny(2)
    assert accepts_slices(tiny.o_proj.weight.weight_loader) and accepts_slices(tiny.embed_tokens.weight.weight_loader)
    assert accepts_slices(model.moe.w13.weight.weight_loader) and not accepts_slices(model.plain.weight_loader)


def test_transform_sees_whole_tensors_and_ranks_keep_their_slices(tmp_path):
    tensors = checkpoint_tensors(2)
    path = write(tmp_path / "ckpt", tensors)
    seen = {}

    def double(name, t):
        seen[name] = tuple(t.shape)
        return t * 2

    params = load_tiny(path, 2, rank=1, tp=2, transform=double)
    assert seen["o_proj.weight"] == (HIDDEN, HEADS * HEAD_SIZE) and len(seen) == len(tensors)
    assert torch.equal(params["o_proj.weight"], tensors["o_proj.weight"][:, 12:] * 2)
    assert torch.equal(params["col.weight"], tensors["col.weight"][18:] * 2)
