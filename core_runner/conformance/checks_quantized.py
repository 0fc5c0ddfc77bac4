"""CR-EQ-18: a quantized checkpoint of the family loads resident in fp8 and computes what
the reference computes on its dequantized weights.

Generated for every ``quantization:<method>`` a registration declares supported (or
xfail). The suite takes the family's first unquantized example (the float32 checkpoint
the other checks use), writes it in each scheme of the method (``quantized.SCHEMES``:
block fp8 for ``fp8``; per-tensor and per-channel float-quantized for
``compressed-tensors``, through the compressed-tensors library) and loads the reference
class from the dequantized weights. The engine on the quantized checkpoint must then:

- give the reference's logits (float32: 1e-4, as CR-EQ-01: the weights are the same
  values on both sides) at every prefill and decode position, and its greedy tokens;
- hold every layer that receives a quantized tensor as float8_e4m3fn with a float32
  scale grid (the method's resident grid), unless that layer is dense by construction
  (``quantized=False``, a loader without the fp8 path: noted in the report, listed per
  family in docs/quantization.md); a layer built for fp8 that fell back to dense (a
  misaligned fused part) fails, as does a model that keeps no layer in fp8;
- refuse by name a variant of the method it cannot load (fp8 without
  ``weight_block_size``; compressed-tensors ``group`` strategy or int weights), and a
  checkpoint of every quantization method it does not declare (``quantization:<method>``).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from core_runner.conformance.harness import Ctx, Example, Recorder, cdiv, examples_of, fail, greedy, run
from core_runner.conformance.quantized import SCHEMES, scheme_config, write_quantized_checkpoint
from core_runner.conformance.reference import reference_class

LENGTHS = [1, 7, 16, 33]
NEW_TOKENS = 8
FP8 = torch.float8_e4m3fn


def _plain_example(ctx: Ctx) -> Example:
    """The first example without a quantization_config (its float32 checkpoint is reused)."""
    for ex in examples_of(ctx.registration):
        if "quantization_config" not in ex.config:
            return ex
    fail(f"{ctx.registration.architecture} has no unquantized example to quantize")
    raise AssertionError  # unreachable: fail raises


def _expected_grid(scheme: str) -> tuple[int, int]:
    """The scale grid the engine's parser gives the scheme's layers (compressed-tensors: [1, 128])."""
    from types import SimpleNamespace

    from core_runner.quantization import quantization_from_config

    parsed = quantization_from_config(SimpleNamespace(quantization_config=scheme_config(scheme)))
    return tuple(parsed.resident_block)


def _engine(ctx: Ctx, base_path: str) -> Any:
    mml = ctx.max_model_len(64)
    # the pool is the base checkpoint's (same model): no extra probe engine per scheme
    return ctx.engine(max_model_len=mml, max_num_seqs=4, num_kv_blocks=ctx.pool(4 * cdiv(mml, 4), base_path))


def _residency(ctx: Ctx, model: torch.nn.Module, names: list[str], scheme: str) -> tuple[int, list[str]]:
    """(fp8 modules checked, modules kept dense by construction) for the quantized tensors ``names``."""
    from core_runner.layers import is_fp8
    from core_runner.loader.parts import WeightRouter

    router, grid = WeightRouter(model), _expected_grid(scheme)
    resident, dense, unrouted = set(), set(), []
    for name in names:
        routed = router.route(name)
        if routed is None:
            unrouted.append(name)
            continue
        module_name = routed[0].rpartition(".")[0]
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            fail(f"{scheme}: checkpoint tensor {name!r} routes to {routed[0]!r}, which is no module of the model")
        if is_fp8(module):
            w, scale = module.weight, getattr(module, "weight_scale_inv", None)
            if w.dtype != FP8 or scale is None or scale.dtype != torch.float32:
                fail(f"{scheme}: {module_name} claims fp8 weights but holds {w.dtype} with scale "
                     f"{None if scale is None else scale.dtype}")
            if tuple(module.fp8_block) != grid:
                fail(f"{scheme}: {module_name} keeps scales on a {list(module.fp8_block)} grid, expected {list(grid)}")
            resident.add(module_name)
        elif hasattr(module, "dense_dtype"):
            fail(f"{scheme}: {module_name} was built for fp8 weights but holds {module.weight.dtype}: its quantized "
                 f"checkpoint tensor {name!r} was dequantized at load (a misaligned fused part or split?)")
        else:
            dense.add(re.sub(r"\.\d+\.", ".N.", module_name))
    if not resident:
        fail(f"{scheme}: no layer keeps fp8 weights ({len(names)} quantized tensors, all loaded dense): "
             "declare the quantization capability unsupported or build the projections from core_runner.layers")
    if unrouted:
        ctx.note(f"{scheme}: {len(unrouted)} quantized tensors ignored by the model's loader: {unrouted[:3]}")
    return len(resident), sorted(dense)


def _compare(ctx: Ctx, ref: Any, scheme: str, base_path: str, names: list[str]) -> None:
    old, ctx.reference = ctx.reference, ref
    try:
        e = _engine(ctx, base_path)
        n_fp8, dense = _residency(ctx, e.debug.model, names, scheme)
        rec = Recorder(e)
        prompts = ref.prompts(LENGTHS, seed=5)
        outs = run(e, [(f"q{i}", p, greedy(NEW_TOKENS)) for i, p in enumerate(prompts)])
        try:
            checked = ctx.expect_logits_match_reference(rec, outs)
            for i, p in enumerate(prompts):
                ctx.expect_greedy(p, outs[f"q{i}"].token_ids, f"{scheme}: q{i} (prompt of {len(p)})", NEW_TOKENS)
        except AssertionError as err:
            raise type(err)(f"{scheme} checkpoint: {err}") from None
    finally:
        ctx.reference = old
    ctx.note(f"{scheme}: {len(names)} quantized tensors, {n_fp8} layers resident fp8, {checked} logits rows "
             f"compared" + (f"; dense by construction: {', '.join(dense)}" if dense else ""))


def _with_config(src: Path, dst: Path, qc: dict) -> Path:
    """``src``'s tensors (linked) under another quantization_config."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f.resolve())
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}))
    return dst


def _variants(method: str, qc: dict) -> list[tuple[str, dict, str]]:
    """(what, config, the word the refusal must name) for schemes of ``method`` not loaded."""
    if method == "fp8":
        return [("fp8 without weight_block_size (per-tensor)", {k: v for k, v in qc.items()
                                                                if k != "weight_block_size"}, "weight_block_size"),
                ("fp8 with static activation scales", {**qc, "activation_scheme": "static"}, "activation_scheme")]
    group = json.loads(json.dumps(qc))
    group["config_groups"]["group_0"]["weights"].update(strategy="group", group_size=16)
    ints = json.loads(json.dumps(qc))
    ints["config_groups"]["group_0"]["weights"].update(type="int")
    ints["config_groups"]["group_0"]["input_activations"] = None
    ints["format"] = "int-quantized"
    return [("compressed-tensors weights with strategy 'group'", group, "group"),
            ("compressed-tensors int-quantized weights", ints, "int-quantized")]


def _refusals(ctx: Ctx, src: Path, base_path: Path, scratch: Path) -> int:
    """Unsupported variants of the method (a config change on ``src``, the quantized
    checkpoint) and every method the registration does not declare (written from the base
    checkpoint) are refused at construction, naming what was found; returns how many."""
    from core_runner import LLM
    from core_runner.conformance.checks_bounds import expect_raises
    from core_runner.oracle import UnsupportedError

    def build(path: Path) -> Any:
        return LLM(str(path), plugins=ctx.pm, dtype="float32", device="cpu", max_model_len=ctx.max_model_len(64),
                   strict=False)

    method = ctx.capability.partition(":")[2]
    qc = json.loads((src / "config.json").read_text())["quantization_config"]
    refused = 0
    for i, (what, cfg, word) in enumerate(_variants(method, qc)):
        expect_raises(lambda c=cfg, i=i: build(_with_config(src, scratch / f"variant{i}", c)), ValueError, what,
                      match=word)
        refused += 1
    reg = ctx.registration
    for cap in sorted(set(SCHEMES.values()) - {ctx.capability}):
        state = reg.capability(cap).state
        if state in ("supported", "xfail"):
            continue  # its own CR-EQ-18 case runs it
        scheme = next(s for s, c in SCHEMES.items() if c == cap)
        path = scratch / f"undeclared-{scheme}"
        write_quantized_checkpoint(base_path, path, None, scheme)
        expect_raises(lambda p=path: build(p), UnsupportedError, f"a {scheme} checkpoint ({cap} declared {state})",
                      match=cap)
        refused += 1
    return refused


def quantized_checkpoint_matches_dequantized(ctx: Ctx) -> None:
    reg, cap = ctx.registration, ctx.capability
    if ctx.session.model:
        import pytest

        pytest.skip("not run: --model checks one given checkpoint; CR-EQ-18 quantizes the registered examples")
    schemes = [s for s, c in SCHEMES.items() if c == cap]
    if not schemes:
        fail(f"{cap}: the suite writes no checkpoint of this method (known: {sorted(set(SCHEMES.values()))})")
    example = _plain_example(ctx)
    base = ctx.session.reference(reg, example)
    safe = re.sub(r"[^A-Za-z0-9_.=+-]+", "_", f"{reg.architecture}-{example.name}")[:100]
    scratch = ctx.session.scratch_dir() / f"quantized-{safe}"
    refused = 0
    for scheme in schemes:
        path = scratch / f"{safe}~{scheme}"
        model, names = write_quantized_checkpoint(base.path, path, reference_class(reg), scheme)
        if not names:
            fail(f"{scheme}: the example {example.name!r} has no projection weight to quantize")
        _compare(ctx, base.with_checkpoint(model, path), scheme, str(base.path), names)
        if scheme == schemes[0]:
            refused = _refusals(ctx, path, Path(base.path), scratch)
    ctx.note(f"example {example.name!r}; {refused} unsupported schemes refused by name")
    shutil.rmtree(scratch, ignore_errors=True)
