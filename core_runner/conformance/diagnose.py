"""Which module diverges first: the diagnosis appended to an equivalence failure.

One prompt runs through the reference model and through the engine (one request, one
prefill step) with a forward hook on every module whose qualified name exists in both
trees; plugins name their modules after the checkpoint's parameters, so
``model.layers.0.mlp`` is the same block on both sides. Modules of one side only (packed
``qkv_proj`` / ``gate_up_proj``, the reference's model-level ``rotary_emb``, the engine's
``attn``) are not compared. Outputs are compared in the reference's execution order (a
forward hook fires when its module returns, so children come before their parent): the
first module over the tolerance is the deepest, earliest one that is wrong, and the
modules before it are right on their own inputs.

Aligning outputs: the reference's are ``[1, seq, ...]`` (or tuples: the first tensor
counts; a router returns (logits, weights, ids)); the engine's are ``[num_tokens, ...]``
(logits only for the last token) or tuples. vLLM's fused residual convention makes a
decoder layer return ``(x, residual)`` where the reference returns ``x + residual``, and
``RMSNorm(x, residual)`` return ``(normed, x + residual)``: for a pair of equally shaped
tensors both the first and their sum are tried, and the closer one counts. A module whose
outputs fit no candidate, or that ran a different number of times, is skipped, never
reported as divergent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import nn

# per engine dtype: (relative to the reference output's largest magnitude, absolute floor).
# Measured: float32 engines of the built-in plugins agree to about 1e-6 relative; a bf16
# Qwen3 checkpoint (hidden 128, 2 layers) to 0.012, 4x under its bound. fp16 is an estimate.
_TOLERANCE = {torch.float32: (1e-4, 1e-6), torch.bfloat16: (5e-2, 1e-3), torch.float16: (1e-2, 1e-4)}
MAX_TOKENS = 4096  # longer failing sequences are diagnosed on their first MAX_TOKENS tokens


@dataclass(frozen=True)
class ModuleDiff:
    name: str
    max_diff: float
    scale: float  # max |reference output|
    how: str  # which engine output was compared
    limit: float

    @property
    def diverges(self) -> bool:
        return not self.max_diff <= self.limit

    @property
    def relative(self) -> float:
        return self.max_diff / self.scale if self.scale > 0 else float("inf") if self.max_diff else 0.0


@dataclass
class Diagnosis:
    num_tokens: int
    compared: list[ModuleDiff] = field(default_factory=list)  # the reference's execution order
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why it was not compared

    @property
    def first_divergence(self) -> ModuleDiff | None:
        return next((d for d in self.compared if d.diverges), None)

    def matched_before(self) -> list[str]:
        """Modules that matched before the first divergence, each folded into its closest
        matching ancestor (``model.layers.0`` stands for all of layer 0)."""
        first = self.first_divergence
        ok = []
        for d in self.compared:
            if d is first:
                break
            ok.append(d.name)
        kept = set(ok)
        return [n for n in ok if not any(n.startswith(a + ".") for a in kept if a != n)]

    def summary(self) -> str:
        head = f"diagnosis (one prefill of {self.num_tokens} tokens, module outputs vs the reference's): "
        names = list(self.skipped)
        skipped = ""
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            skipped = f"; not comparable, skipped: {', '.join(names[:3])}{more}"
        if not self.compared:
            reasons = "; ".join(f"{n}: {why}" for n, why in list(self.skipped.items())[:4])
            return head + f"no module could be aligned ({reasons})"
        first = self.first_divergence
        if first is None:
            worst = max(self.compared, key=lambda d: d.relative)
            return head + (f"every aligned module matches ({len(self.compared)} compared; largest relative "
                           f"difference {worst.relative:.2g} at {worst.name}){skipped}: the model is right on one "
                           "prefill, so look at what the failing run did differently (chunks, batch, rows, "
                           "preemption, cached or recurrent state, positions, pooling)")
        matched = self.matched_before()
        before = f"{', '.join(matched)} match" if matched else "no module before it was compared"
        how = "" if first.how == "output" else f", {first.how}"
        return head + (f"first divergence: {first.name}: max |diff| {first.max_diff:.3g} (max |ref| "
                       f"{first.scale:.3g}{how}) ({before}){skipped}")


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return _TOLERANCE.get(dtype, _TOLERANCE[torch.bfloat16])


# ---------------------------------------------------------------------------------
# recording
# ---------------------------------------------------------------------------------
def _tensors(out: Any) -> list[torch.Tensor]:
    """The top-level tensors of a module's output (a ModelOutput is a mapping), detached and
    copied: a fused kernel may later update an output in place."""
    if isinstance(out, torch.Tensor):
        items: list[Any] = [out]
    elif isinstance(out, Mapping):
        items = list(out.values())
    elif isinstance(out, (tuple, list)):
        items = list(out)
    else:
        items = []
    return [t.detach().clone() for t in items if isinstance(t, torch.Tensor)]


class _Hooks:
    """Every call's outputs of the named modules, and the order in which they first returned."""

    def __init__(self, model: nn.Module, names: set[str]) -> None:
        self.calls: dict[str, list[list[torch.Tensor]]] = {}
        self.order: list[str] = []
        self._handles = [m.register_forward_hook(self._hook(n)) for n, m in model.named_modules() if n in names]

    def _hook(self, name: str) -> Any:
        def fn(_module: nn.Module, _args: Any, out: Any) -> None:
            if name not in self.calls:
                self.calls[name] = []
                self.order.append(name)
            self.calls[name].append(_tensors(out))
        return fn

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


# ---------------------------------------------------------------------------------
# alignment
# ---------------------------------------------------------------------------------
def _reference_rows(t: torch.Tensor, n: int) -> torch.Tensor | None:
    """[n, -1] from a reference output: [1, n, ...] loses its batch dim, [n, ...] is kept."""
    if t.dim() >= 3 and t.shape[0] == 1:
        t = t[0]
    if t.dim() == 0 or t.shape[0] != n:
        return None
    return t.reshape(n, -1).float()


def _engine_candidates(ts: list[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    floats = [t for t in ts if t.is_floating_point()]
    if not floats:
        return []
    out = [("output", floats[0])]
    if len(ts) >= 2 and ts[0].is_floating_point() and ts[1].is_floating_point() and ts[0].shape == ts[1].shape:
        out.append(("sum of its two outputs (fused residual)", ts[0].float() + ts[1].float()))
    return out


def _compare(name: str, ref: list[torch.Tensor], eng: list[torch.Tensor], n: int,
             tol: tuple[float, float]) -> ModuleDiff | str:
    """The closest alignment of one call's outputs, or why there is none."""
    want = next((t for t in ref if t.is_floating_point()), None)
    if want is None:
        return "the reference's output has no floating-point tensor"
    rows = _reference_rows(want, n)
    if rows is None:
        return f"reference output of shape {tuple(want.shape)} is not per token"
    best: ModuleDiff | None = None
    shapes = []
    for how, got in _engine_candidates(eng):
        shapes.append(tuple(got.shape))
        target = rows
        if got.dim() >= 1 and got.shape[0] > n:  # padded tokens past the real ones
            got = got[:n]
        if got.dim() >= 1 and got.shape[0] == 1 and n > 1:  # the engine computes logits for the last token only
            target, how = rows[-1:], f"{how}, last token"
        if got.dim() == 0 or got.numel() != target.numel():
            continue
        diff = float((got.reshape(target.shape).float() - target).abs().max())
        scale = float(target.abs().max())
        d = ModuleDiff(name, diff, scale, how, tol[0] * scale + tol[1])
        if best is None or d.max_diff < best.max_diff:
            best = d
    if best is None:
        return f"no engine output fits the reference's {tuple(want.shape)} (engine: {shapes or 'no float tensor'})"
    return best


# ---------------------------------------------------------------------------------
# the diagnosis
# ---------------------------------------------------------------------------------
def _run_engine(engine: Any, prompt: list[int]) -> None:
    from core_runner import PoolingParams, SamplingParams

    if "generate" in engine.tasks:
        engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
                           req_id="diagnosis")
    else:
        engine.add_request(prompt, pooling_params=PoolingParams(), req_id="diagnosis")
    for _ in range(8 + len(prompt)):
        if not engine.has_unfinished_requests():
            return
        engine.step()
    raise RuntimeError("the diagnosis request did not finish")


def diagnose(reference: Any, engine: Any, prompt: list[int]) -> Diagnosis:
    """Run ``prompt`` through ``reference.model`` (float32) and the engine (an idle one,
    built from ``reference.path`` with a step budget that holds the whole prompt) and
    compare the outputs of every module both models name alike."""
    prompt = list(prompt)[:MAX_TOKENS]
    n = len(prompt)
    ref_model: nn.Module = reference.model
    eng_model: nn.Module = engine.debug.model
    ref_names = {name for name, _ in ref_model.named_modules() if name}
    eng_names = {name for name, _ in eng_model.named_modules() if name}
    shared = ref_names & eng_names

    hooks = _Hooks(ref_model, shared)
    try:
        ids = torch.tensor([prompt], dtype=torch.long)
        with torch.no_grad():
            ref_model(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        hooks.remove()
    theirs = _Hooks(eng_model, shared)
    forwards = [0]
    counter = eng_model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    try:
        _run_engine(engine, prompt)
    finally:
        theirs.remove()
        counter.remove()
    if forwards[0] != 1:
        raise RuntimeError(f"the engine ran its model {forwards[0]} times for one prompt of {n} tokens "
                           "(a one-step prefill was expected)")

    tol = tolerance(getattr(engine, "dtype", torch.float32))
    out = Diagnosis(n)
    for name in hooks.order:
        ref_calls, eng_calls = hooks.calls[name], theirs.calls.get(name)
        if not eng_calls:
            out.skipped[name] = "never ran in the engine"
            continue
        if len(eng_calls) != len(ref_calls):
            out.skipped[name] = f"ran {len(eng_calls)} times in the engine, {len(ref_calls)} in the reference"
            continue
        results = [_compare(name, r, e, n, tol) for r, e in zip(ref_calls, eng_calls)]
        why = next((r for r in results if isinstance(r, str)), None)
        if why is not None:
            out.skipped[name] = why
            continue
        out.compared.append(max(results, key=lambda d: d.max_diff - d.limit))
    return out


def explain(reference: Any, make_engine: Any, prompt: list[int]) -> str:
    """``diagnose``'s summary, or why there is none: never raises, so that a failure the
    diagnosis was meant to explain is reported as it is. ``make_engine(max_model_len)``
    builds the engine."""
    try:
        prompt = list(prompt)[:MAX_TOKENS]
        return diagnose(reference, make_engine(len(prompt) + 1), prompt).summary()
    except Exception as err:  # noqa: BLE001 - any error in the diagnosis must not mask the real failure
        return f"diagnosis unavailable: {type(err).__name__}: {str(err)[:300]}"
