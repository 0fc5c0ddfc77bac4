"""What the checks share: engine construction, a step recorder
(over ``engine.debug``, the engine's inspection API), and comparisons that record what
the report needs (max logit error, first divergent token). The reference side
(examples, reference models and checkpoints) is ``reference.py``, re-exported here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from core_runner.conformance.reference import (  # noqa: F401 - re-exported: the checks import them from here
    DEFAULT_INIT_RANGE,
    Example,
    Reference,
    examples_of,
    randomize_every_tensor,
    reference_class,
    reference_config,
    unchanged_tensors,
)
from core_runner.conformance.tolerance import Tolerance
from core_runner.registry import Registration

LOGIT_ATOL = 1e-4  # float32 logits against the reference
TIE_EPS = 2e-4  # a greedy divergence where the reference's top-2 gap is this small is a tie, not a bug


class CheckFailure(AssertionError):
    """A check's claim does not hold; the message says what was observed."""


def fail(message: str) -> None:
    raise CheckFailure(message)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------
# sampling parameters
# ---------------------------------------------------------------------------------
def sampling_fields() -> set[str]:
    from core_runner.sampling_params import SamplingParams

    return {f.name for f in dataclasses.fields(SamplingParams)}


def supports_logprobs() -> bool:
    return "logprobs" in sampling_fields()


def greedy(n: int) -> Any:
    """At most n greedy tokens (``AtMost``: fewer where max_model_len leaves fewer after the prompt)."""
    from core_runner import SamplingParams
    from core_runner.sampling_params import AtMost

    return SamplingParams(max_tokens=AtMost(n), temperature=0.0, ignore_eos=True)


def sampled(n: int, seed: int | None = 1234, temperature: float = 0.8, top_p: float = 0.9, top_k: int = -1,
            logprobs: int | None = None) -> Any:
    """A fresh SamplingParams each call (a state must not be able to leak edits between runs); at most
    n tokens, as ``greedy``."""
    from core_runner import SamplingParams
    from core_runner.sampling_params import AtMost

    kw: dict[str, Any] = dict(max_tokens=AtMost(n), temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                              ignore_eos=True)
    if logprobs is not None and supports_logprobs():
        kw["logprobs"] = logprobs
    return SamplingParams(**kw)


# ---------------------------------------------------------------------------------
# driving an engine
# ---------------------------------------------------------------------------------
class Recorder:
    """Every real step of an engine, as ``engine.debug.record_steps()`` logs it: ``steps`` is
    the engine's live list of ``StepRecord``s (batch order, rows after the step, logits on
    the host), so one engine's Recorders share it. ``strict`` also fails, during the step,
    when a launched step's logits break the runner's contract: an empty step produced
    logits, a real step of a generating model produced them other than once, for other
    requests than the scheduled ones, or not shaped [num_reqs, vocab]."""

    def __init__(self, engine: Any, strict: bool = False) -> None:
        self.engine = engine
        self.steps = engine.debug.record_steps()
        self._dummy_base = engine.debug.num_dummy_runs
        self._logits_calls: list[tuple[list[str], tuple[int, ...]]] = []
        if strict:
            engine.debug.on_logits(self._saw_logits)
            engine.debug.on_step(self._check_step)

    @property
    def num_dummy(self) -> int:
        """Dummy runs (``engine.dummy_run`` or ``execute_model(dummy=True)``) since this Recorder began."""
        return self.engine.debug.num_dummy_runs - self._dummy_base

    def _saw_logits(self, req_ids: list[str], logits: torch.Tensor) -> None:
        self._logits_calls.append((list(req_ids), tuple(logits.shape)))

    def _check_step(self, out: Any) -> None:
        calls, self._logits_calls = self._logits_calls, []
        if out.is_empty:
            if calls:
                fail(f"an empty step produced logits for {calls[0][0]}")
            return
        if "generate" not in self.engine.tasks:
            return
        if len(calls) != 1:
            fail(f"a real step must produce its logits once, it produced them {len(calls)} times")
        req_ids, shape = calls[0]
        if sorted(req_ids) != sorted(out.num_scheduled_tokens):
            fail(f"logits for {req_ids}, but the step scheduled {sorted(out.num_scheduled_tokens)}")
        if shape != (len(req_ids), self.engine.vocab_size):
            fail(f"logits of shape {shape} for {len(req_ids)} requests and a vocabulary of {self.engine.vocab_size}")
        if not self.steps or self.steps[-1].req_ids != req_ids:
            fail("engine.debug did not record the step")

    def rows_of(self, req_id: str) -> list[int]:
        return [s.rows[req_id] for s in self.steps if req_id in s.rows]

    def logits_of(self, req_id: str) -> list[tuple[int, torch.Tensor]]:
        """(position whose next token these logits predict, logits) for each step of req_id."""
        return [(s.num_computed[req_id] + s.num_scheduled[req_id] - 1, s.logits[req_id])
                for s in self.steps if req_id in s.logits]

    def sampling_logits(self, req_id: str, prompt_len: int) -> list[torch.Tensor]:
        """Logits that produced each output token, in output order (the last computation of
        each position, so a preempted-and-recomputed step counts once)."""
        by_pos = {p: lg for p, lg in self.logits_of(req_id) if p >= prompt_len - 1}
        return [by_pos[p] for p in sorted(by_pos)]


def step_until(engine: Any, outputs: dict, cond: Callable[[], bool], max_steps: int = 3000) -> None:
    for _ in range(max_steps):
        if cond():
            return
        if not engine.has_unfinished_requests():
            fail("no unfinished request is left but the awaited condition never held")
        for o in engine.step():
            if o.req_id in outputs:
                fail(f"request {o.req_id} finished twice")
            if getattr(o, "finish_reason", None) == "error":
                # no check may pass on an output it did not get: the rows recorded before the fault match
                fail(f"request {o.req_id} finished with finish_reason='error' after {len(o.token_ids)} tokens "
                     f"(prompt of {len(o.prompt_token_ids)})")
            outputs[o.req_id] = o
    fail(f"condition not reached within {max_steps} steps")


def drain(engine: Any, outputs: dict | None = None) -> dict:
    outputs = {} if outputs is None else outputs
    step_until(engine, outputs, lambda: not engine.has_unfinished_requests())
    return outputs


def expect_complete(engine: Any, requests: list[tuple[str, list[int], Any]], outputs: dict) -> None:
    """Each generate request that ignores EOS finished by length with every token it asked
    for (fewer only where max_model_len ends it)."""
    limit = getattr(getattr(engine, "config", None), "max_model_len", None)
    for req_id, prompt, params in requests:
        n = getattr(params, "max_tokens", None)
        if req_id not in outputs:
            fail(f"request {req_id} never finished")
        if n is None or not getattr(params, "ignore_eos", False):
            continue
        want = n if limit is None else min(n, limit - len(prompt))
        o = outputs[req_id]
        if len(o.token_ids) != want or o.finish_reason != "length":
            fail(f"request {req_id} (prompt of {len(prompt)}) finished with {len(o.token_ids)} tokens and "
                 f"finish_reason={o.finish_reason!r}; it asked for {want} and should end by 'length'")


def run(engine: Any, requests: list[tuple[str, list[int], Any]]) -> dict:
    for req_id, prompt, params in requests:
        engine.add_request(prompt, params, req_id=req_id)
    outputs = drain(engine)
    expect_complete(engine, requests, outputs)
    return outputs


# ---------------------------------------------------------------------------------
# the per-check context
# ---------------------------------------------------------------------------------
_KV_GROUPS: dict[str, int] = {}  # checkpoint path -> KV cache groups of its engine
_ROW_STATE: dict[str, bool] = {}  # checkpoint path -> whether its model keeps per-row state


def _remember(path: str, report: dict) -> None:
    """Cache what an engine on ``path`` reports of its caches (its memory_report)."""
    _KV_GROUPS[path] = report["kv_cache_groups"]
    _ROW_STATE[path] = report["state_bytes_per_row"] > 0


@dataclass
class Ctx:
    """What a check gets: its case, the plugin manager, references and engines, and a
    place to record the report's measurements."""

    session: Any
    check: Any
    registration: Registration | None = None
    example: Example | None = None
    capability: str | None = None
    metrics: dict = field(default_factory=lambda: {"max_logit_error": None, "first_divergent_token": None,
                                                   "notes": []})
    reference: Reference | None = None  # set: this reference instead of the session's for the example
    diagnose: bool = True  # a failure against the reference names the first diverging module
    # a variant of an example: the example's KV cache group count, which most variants share
    # (``llm`` then builds no probe engine to count them first)
    kv_groups_hint: int | None = None

    @property
    def tolerance(self) -> Tolerance:
        return getattr(self.session, "tolerance", None) or Tolerance()

    @property
    def pm(self) -> Any:
        """The plugin manager with only the plugin under test. For a check of a capability
        declared ``xfail``, a copy that declares it supported, so that the oracle lets it run."""
        cap = self.check.capability
        if cap and cap.endswith("*"):  # a check of a capability family: this case's member
            cap = self.capability
        if cap and self.registration is not None and self.registration.capability(cap).state == "xfail":
            return self.session.forcing_pm(self.registration, cap)
        return self.session.pm

    @property
    def ref(self) -> Reference:
        if self.reference is not None:
            return self.reference
        return self.session.reference(self.registration, self.example or self.session.first_example(self.registration))

    @property
    def chunked(self) -> bool:
        return self.registration.capability("chunked_prefill").supported

    def llm(self, memory_probe: Callable[[torch.device], int] | None = None, **overrides: Any) -> Any:
        """An LLM on the example's checkpoint with small defaults; the KV pool holds
        max_num_seqs full-length requests unless num_kv_blocks is given. ``memory_probe``
        (device -> free bytes) stands in for the free memory a pool of num_kv_blocks=None is
        sized from."""
        from core_runner import LLM

        opts: dict[str, Any] = dict(dtype=self.tolerance.dtype, device="cpu", max_model_len=self.max_model_len(128),
                                    max_num_seqs=8, block_size=4, strict=False)
        opts.update(overrides)
        model = opts.pop("model", str(self.ref.path))  # another checkpoint of the example (a variant)
        sizes = [opts["max_num_seqs"], opts["max_model_len"], opts["block_size"]]
        if "num_kv_blocks" not in overrides and all(isinstance(v, int) and v > 0 for v in sizes):
            blocks = opts["max_num_seqs"] * cdiv(opts["max_model_len"], opts["block_size"])
            guess = self.kv_groups_hint if model not in _KV_GROUPS else None
            if guess:  # checked against the engine's own count, and built again when it differs
                try:
                    llm = LLM(model, plugins=self.pm, memory_probe=memory_probe, num_kv_blocks=blocks * guess, **opts)
                except ValueError:
                    llm = None  # e.g. more groups than guessed cannot hold a request: probed below
                if llm is not None:
                    _remember(model, llm.engine.memory_report())
                    if _KV_GROUPS[model] == guess:
                        return llm
                    llm.engine.shutdown()
            opts["num_kv_blocks"] = self.pool(blocks, model, opts.get("load_format"))
        return LLM(model, plugins=self.pm, memory_probe=memory_probe, **opts)

    def pool(self, blocks: int, model: str | None = None, load_format: str | None = None) -> int | None:
        """num_kv_blocks holding the memory of ``blocks`` blocks of every layer: a model whose
        KV cache groups share memory (core_runner/kv_cache_groups.py) spends one block id per
        group where a one-group model spends one for all layers. None for a model without
        paged layers (zero groups), which has no pool and refuses num_kv_blocks."""
        groups = self.kv_cache_groups(model, load_format)
        return blocks * groups if groups else None

    @property
    def paged(self) -> bool:
        """The example's model has paged (attention) layers; False for an attention-free one."""
        return self.kv_cache_groups() > 0

    @property
    def row_state(self) -> bool:
        """The example's model keeps per-row recurrent state (``RowStateSpec`` layers)."""
        self.kv_cache_groups()
        return _ROW_STATE[str(self.ref.path)]

    def kv_cache_groups(self, model: str | None = None, load_format: str | None = None) -> int:
        """The model's KV cache group count, from a probe engine on its checkpoint (built with
        ``load_format``: a config-only checkpoint, as CR-SPEC-03's, needs "dummy")."""
        from core_runner import LLM

        path = model or str(self.ref.path)
        if path not in _KV_GROUPS:
            # num_kv_blocks=None: a pool of at most one 16-token request (4 blocks a group), and
            # none for a model without paged layers (which would refuse num_kv_blocks)
            load = {} if load_format is None else {"load_format": load_format}
            probe = LLM(path, plugins=self.pm, dtype=self.tolerance.dtype, device="cpu", max_model_len=16,
                        max_num_seqs=1, block_size=4, num_kv_blocks=None, strict=False, **load)
            _remember(path, probe.engine.memory_report())
        return _KV_GROUPS[path]

    def confirm_not_applicable(self) -> None:
        """A capability declared "not applicable: <reason>" (``registry.MAY_NOT_APPLY``):
        check the claim, then report the check as not run. triton_attention: the model has
        no paged attention layer, so no attention backend is ever called."""
        cap = self.capability or ""
        state = self.registration.capability(cap)
        if cap == "triton_attention" and self.paged:
            fail(f"triton_attention is declared not applicable ({state.reason}) but the model has paged attention "
                 f"layers ({self.kv_cache_groups()} KV cache groups): declare it supported or unsupported")
        import pytest

        pytest.skip(f"not run: not applicable: {state.reason} (checked: the model has no paged KV cache)")

    def engine(self, memory_probe: Callable[[torch.device], int] | None = None, **overrides: Any) -> Any:
        return self.llm(memory_probe, **overrides).engine

    def max_model_len(self, wanted: int) -> int:
        mp = self.ref.max_position
        return min(wanted, mp) if mp else wanted

    def note(self, text: str) -> None:
        self.metrics["notes"].append(text)

    # ---- comparisons that feed the report ------------------------------------------
    def logit_error(self, got: torch.Tensor, want: torch.Tensor, where: str, atol: float | None = None) -> float:
        """``atol`` given: an absolute bound on raw logits (0.0: bit-identical); otherwise
        the run's tolerance (1e-4 in float32, a log-softmax bound in low precision)."""
        tol = self.tolerance
        if atol is None and not tol.exact:
            err, limit, measure = tol.error(got, want), tol.limit, tol.measure
        else:
            err = float((got.float() - want.float()).abs().max())
            limit, measure = (LOGIT_ATOL if atol is None else atol), "logits differ by"
        prev = self.metrics["max_logit_error"]
        self.metrics["max_logit_error"] = err if prev is None else max(prev, err)
        if not err <= limit:
            fail(f"{where}: {measure} {err:.3g} > {limit:g}")
        return err

    def expect_tokens(self, got: list[int], want: list[int], where: str) -> None:
        """Engine-vs-engine token equality (same model, other schedule)."""
        for k, (a, b) in enumerate(zip(got, want)):
            if a != b:
                self._divergence(where, k, a, b)
                fail(f"{where}: token {k} is {a}, expected {b} (got {got}, expected {want})")
        if len(got) != len(want):
            fail(f"{where}: {len(got)} tokens, expected {len(want)}")

    def expect_greedy(self, prompt: list[int], got: list[int], where: str, n: int | None = None) -> None:
        """Greedy tokens equal the reference's; a divergence at a reference near-tie
        (top-2 gap <= TIE_EPS) ends the comparison there and is noted, not failed."""
        n = len(got) if n is None else n
        if len(got) != n:
            fail(f"{where}: {len(got)} tokens generated, expected {n}")
        want = self.ref.greedy(prompt, n)
        for k, (a, b) in enumerate(zip(got, want)):
            if a == b:
                continue
            row = self.ref.logits(list(prompt) + list(got[:k]))[-1]
            gap = float(row[b] - row[a])
            if gap <= self.tolerance.tie:
                self.note(f"{where}: tie at output token {k} (reference gap {gap:.2g}); compared up to it")
                return
            self._divergence(where, k, a, b, gap)
            fail(f"{where}: output token {k} is {a}, the reference's greedy token is {b} "
                 f"(reference logit gap {gap:.3g}); engine {got}, reference {want}"
                 + self.diagnosis(list(prompt) + list(got[:k])))

    def _divergence(self, where: str, index: int, got: int, want: int, gap: float | None = None) -> None:
        if self.metrics["first_divergent_token"] is None:
            self.metrics["first_divergent_token"] = {"where": where, "index": index, "got": got, "expected": want,
                                                     "reference_gap": gap}

    def expect_logits_match_reference(self, rec: Recorder, outputs: dict) -> int:
        """Every recorded logits row of every request equals the reference's at the same
        position. All rows are compared (the report gets the maximum error) before failing."""
        worst: tuple[float, str] = (-1.0, "")
        worst_seq: list[int] = []
        checked = 0
        tol = self.tolerance
        for req_id, out in outputs.items():
            seq = list(out.prompt_token_ids) + list(out.token_ids)
            entries = rec.logits_of(req_id)
            if not entries:
                fail(f"{req_id}: no logits were recorded")
            ref = self.ref.logits(seq[:-1]) if len(seq) > 1 else self.ref.logits(seq)
            for pos, lg in entries:
                err = tol.error(lg, ref[pos])
                if err > worst[0]:
                    worst, worst_seq = (err, f"{req_id} position {pos}"), seq[:pos + 1]
                checked += 1
        prev = self.metrics["max_logit_error"]
        self.metrics["max_logit_error"] = worst[0] if prev is None else max(prev, worst[0])
        if not worst[0] <= tol.limit:
            fail(f"logits differ from the reference: {tol.measure} {worst[0]:.3g} > {tol.limit:g} (worst: "
                 f"{worst[1]}; {checked} rows compared, engine dtype {tol.dtype})" + self.diagnosis(worst_seq))
        return checked

    def diagnosis(self, seq: list[int]) -> str:
        """For a failure message: which module first diverges from the reference on ``seq``
        run alone in one prefill (``conformance/diagnose.py``); only ever called on a failure."""
        if not self.diagnose or not seq:
            return ""
        from core_runner.conformance.diagnose import MAX_TOKENS, explain

        longest = self.max_model_len(MAX_TOKENS + 1)

        def build(max_len: int) -> Any:
            mml = self.max_model_len(max(max_len, 64))
            return self.engine(max_model_len=mml, max_num_seqs=1, max_num_batched_tokens=mml)

        return "\n" + explain(self.ref, build, list(seq)[:longest - 1])
