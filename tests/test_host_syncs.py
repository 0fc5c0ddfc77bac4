"""No host synchronisation in a step: ``core_runner/runner/sync_audit.py`` on the CPU.

The first tests prove the audit: every kind of sync it knows, planted on a line of this
file, is reported once at that line; host work, sync-free device work and the designed
non-blocking copies are not; a sync planted in a real step (a logits hook reading a
device table) is reported with its location, and the engine's read of the step's
results (``AsyncOutput.get``, outside the step) is not.

The last ones audit real steps of a tiny Qwen3 engine (decode, prefill chunks, n-gram
and draft-model speculation, async scheduling as on a GPU) and assert the exact set of
syncs found, so that the lists below change only on purpose: removing a sync turns a
test red until its entry goes, adding one turns it red until it is listed (or removed).
Two groups are CPU-only by design and listed apart from the shared hot path (which has
none left): the torch reference twins of the Triton kernels (input prep, post-update, the
torch attention backend's KV write), and the exact host lengths that speculation copies
back for a backend that reads host lengths (the torch reference, not graph-capable); a
speculative test also runs the branch a graph-capable backend (the GPU's) takes.
"""
from __future__ import annotations

import inspect
import operator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import TINY, make_engine, random_prompts
from spec_draft_fixture import plugins_with_draft, write_draft
from test_spec_decode import ngram

from core_runner import SamplingParams
from core_runner.config import EngineConfig
from core_runner.engine.llm_engine import LLMEngine
from core_runner.runner.sync_audit import DEFAULT_ROOTS, SyncAudit, count_host_syncs
from core_runner.step_data.buffers import UvaBackedTensor

HERE = "tests/test_host_syncs.py"
DEV = torch.device("cpu")  # the device the audited tensors stand for (a torch.device: see the audit's rules)

# (path, function, op) of the syncs of the torch reference path, which the GPU replaces
# with Triton kernels (input prep, post-update, the KV write of the attention backend)
REFERENCE_TWINS = {
    ("core_runner/kernels/input_prep.py", "prepare_inputs_ref", "Tensor.__int__: device value read"),
    ("core_runner/kernels/input_prep.py", "prepare_inputs_ref",
     "torch.repeat_interleave: data-dependent shape (repeat_interleave without output_size)"),
    ("core_runner/kernels/input_prep.py", "post_update_ref", "Tensor.__getitem__: boolean mask"),
    ("core_runner/attention/torch_backend.py", "write_kv_ref", "Tensor.__getitem__: boolean mask"),
}
# syncs of the shared hot path, which a GPU runs too, by step kind: none left. Before the
# lead's zero-sync work (07bb33e, e46590c) n-gram steps had two and draft steps one:
# ("core_runner/runner/model_runner.py", "_propose", "torch.tensor: blocking H2D copy"),
# ("core_runner/runner/spec_decode.py", "write_proposals", "Tensor.__getitem__: boolean mask").
HOT_PATH: dict[str, set[tuple[str, str, str]]] = {"decode": set(), "prefill": set(), "ngram": set(), "draft": set()}
# with speculation the host's lengths are upper bounds while a step is in flight; a backend
# that reads host lengths gets exact ones copied back (``exact_host_lengths``): a blocking
# copy per step (and per draft decode pass), skipped by a graph-capable backend
EXACT_LENGTHS = {
    "ngram": {("core_runner/runner/model_runner.py", "_build_batch", "Tensor.cpu: blocking D2H copy")},
    "draft": {("core_runner/runner/model_runner.py", "_build_batch", "Tensor.cpu: blocking D2H copy"),
              ("core_runner/runner/drafter.py", "_decode_batch", "Tensor.cpu: blocking D2H copy")},
}


@pytest.fixture
def d():
    """Device tensors (tainted) and an audit that knows them and locates syncs in tests/ too."""
    audit = SyncAudit(roots=(*DEFAULT_ROOTS, "tests/"))
    ids = torch.tensor([5, 1, 4, 1, 5, 9, 2, 6])
    t = SimpleNamespace(audit=audit, ids=ids, probs=torch.linspace(0.1, 0.8, 8), mask=ids > 3,
                        counts=torch.tensor([1, 0, 2, 1, 0, 1, 1, 0]), idx=torch.tensor([7, 0, 3]))
    audit.mark(t.ids, t.probs, t.mask, t.counts, t.idx)
    return t


# (torch call, kind, planted sync): each lambda on its own line, which is where it must be reported
PLANTED = [
    ("Tensor.item", "read", lambda d: d.ids[0].item()),
    ("Tensor.__int__", "read", lambda d: int(d.ids.max())),
    ("Tensor.__bool__", "read", lambda d: bool(d.mask.any())),
    ("Tensor.__float__", "read", lambda d: float(d.probs[0])),
    ("Tensor.__index__", "read", lambda d: range(d.ids[0])),
    ("Tensor.tolist", "read", lambda d: d.ids.tolist()),
    ("Tensor.numpy", "read", lambda d: d.ids.numpy()),
    ("Tensor.__format__", "read", lambda d: f"{d.ids[0]}"),
    ("torch.equal", "read", lambda d: torch.equal(d.ids, d.idx)),
    ("torch.arange", "read", lambda d: torch.arange(d.ids[2])),
    ("Tensor.masked_fill", "read", lambda d: d.probs.masked_fill(d.mask, d.probs[0])),
    ("Tensor.__getitem__", "shape", lambda d: d.ids[d.mask]),
    ("Tensor.__setitem__", "shape", lambda d: operator.setitem(d.probs, d.mask, torch.zeros(5, device=DEV))),
    ("Tensor.index_put_", "shape", lambda d: d.ids.index_put_((d.mask,), torch.zeros(5, dtype=torch.int64))),
    ("Tensor.nonzero", "shape", lambda d: d.mask.nonzero()),
    ("torch.where", "shape", lambda d: torch.where(d.mask)),
    ("torch.argwhere", "shape", lambda d: torch.argwhere(d.mask)),
    ("torch.masked_select", "shape", lambda d: torch.masked_select(d.ids, d.mask)),
    ("torch.unique", "shape", lambda d: torch.unique(d.ids)),
    ("torch.bincount", "shape", lambda d: torch.bincount(d.ids)),
    ("torch.repeat_interleave", "shape", lambda d: torch.repeat_interleave(d.ids, d.counts)),
    ("Tensor.cpu", "copy", lambda d: d.ids.cpu()),
    ("Tensor.to", "copy", lambda d: d.ids.to("cpu")),
    ("Tensor.copy_", "copy", lambda d: torch.empty(8, dtype=torch.int64).copy_(d.ids)),
    ("Tensor.to", "copy", lambda d: torch.arange(3).to(DEV)),
    ("torch.tensor", "copy", lambda d: torch.tensor([1, 2], device=DEV)),
    ("Tensor.new_tensor", "copy", lambda d: d.ids.new_tensor([1, 2])),
    ("Tensor.__setitem__", "copy", lambda d: operator.setitem(d.ids, 0, 5)),
]


@pytest.mark.parametrize("call,kind,plant", PLANTED, ids=[f"{c}-{k}" for c, k, _ in PLANTED])
def test_each_planted_sync_is_reported_at_its_line(d, call, kind, plant):
    with torch.inference_mode(), d.audit.tracking():
        plant(d)
    assert len(d.audit.events) == 1, d.audit.report()
    e = d.audit.events[0]
    assert (e.path, e.line, e.func, e.kind) == (HERE, plant.__code__.co_firstlineno, "<lambda>", kind), str(e)
    assert e.op.startswith(call + ": "), e.op


def test_host_work_and_sync_free_device_work_are_not_reported(d):
    a = d.audit
    with torch.inference_mode(), a.tracking():
        # host work: lists, tensors built from them, reads of host tensors
        rows = [3, 1, 2]
        host = torch.tensor(rows, dtype=torch.int64)
        assert int(host.sum()) == 6 and host.tolist() == rows and host[host > 1].numel() == 2
        # the designed H2D path: one non-blocking copy; the original stays host
        on_device = host.to(DEV, non_blocking=True)
        assert a.is_device(on_device) and not a.is_device(host)
        # device work whose sizes are known on the host
        made = torch.zeros(4, device=DEV)
        picked = d.ids[d.idx].gather(0, torch.zeros(2, dtype=torch.int64, device=DEV))
        best = torch.where(d.mask, d.ids, 0).argmax()
        top = d.probs.softmax(0).topk(2).indices
        rep = torch.repeat_interleave(d.ids, d.counts, output_size=6)
        d.ids[d.mask] = 0  # a boolean mask with a host scalar runs as masked_fill_ (no sync)
        d.ids[:2] = 3
        narrow = d.ids.to(torch.int32)
        # the designed D2H path: a non-blocking copy into host memory (read later, outside)
        buf = torch.empty(8, dtype=torch.int64)
        buf.copy_(d.ids, non_blocking=True)
    assert a.events == [], a.report()
    assert all(a.is_device(t) for t in (made, picked, best, top, rep, narrow, buf))


def test_device_data_left_in_host_memory_is_reported_when_read(d):
    a = d.audit
    buf = torch.zeros(10, dtype=torch.int64)
    after = torch.zeros(8, dtype=torch.int64)
    with torch.inference_mode(), a.tracking():
        buf[2:].copy_(d.ids, non_blocking=True)
        in_flight = buf[:4].tolist()  # sync: another view of the same host memory, still in flight
        after.copy_(d.ids)  # sync: a blocking copy; the data is on the host afterwards
        done = after.tolist()
    assert [(e.op, e.line) for e in a.events] == [
        ("Tensor.tolist: device value read", _line_of("another view of the same host memory")),
        ("Tensor.copy_: blocking D2H copy", _line_of("a blocking copy; the data")),
    ], a.report()
    assert in_flight == [0, 0, 5, 1] and done == d.ids.tolist()


def test_uva_host_mirror_is_host_and_its_snapshot_is_device(d):
    """The rule for UvaBackedTensor on the CPU, where ``.gpu is .cpu``: the host mirror is
    written from host values and read on the host; ``snapshot()`` is the device copy."""
    a = d.audit
    uva = UvaBackedTensor((6,), torch.int32, DEV)
    assert uva.gpu is uva.cpu
    with torch.inference_mode(), a.tracking():
        uva.cpu[:3] = torch.tensor([4, 0, 2], dtype=torch.int32)
        view = uva.snapshot(3)
        host_copy = uva.cpu[:3].clone()
        assert host_copy.tolist() == [4, 0, 2] and int(uva.cpu[0]) == 4
        shifted = view + 1
        assert a.events == [], a.report()
        assert a.is_device(view) and a.is_device(shifted) and not a.is_device(uva.cpu)
        total = int(view.sum())  # sync: a read of the device copy
        uva.cpu[3:5].copy_(d.ids[:2], non_blocking=True)  # device data into the host mirror
        mirror = uva.cpu.tolist()  # sync: the host mirror now holds device data
    assert total == 6 and mirror[3:5] == [5, 1]
    assert [(e.op, e.line) for e in a.events] == [
        ("Tensor.__int__: device value read", _line_of("a read of the device copy")),
        ("Tensor.tolist: device value read", _line_of("the host mirror now holds device data")),
    ], a.report()


def _line_of(tag: str) -> int:
    """The line of this file whose comment is ``# sync: <tag>...`` (exactly one)."""
    lines = [i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if f"# sync: {tag}" in line]
    assert len(lines) == 1, (tag, lines)
    return lines[0]


# ---- real steps ------------------------------------------------------------------------------
def _steps(eng, n: int | None = None) -> None:
    """n steps, or until every request finished."""
    while (n is None or n > 0) and eng.has_unfinished_requests():
        eng.step()
        n = None if n is None else n - 1


def _generate(eng, prompts: list[list[int]], params: SamplingParams) -> dict[str, list[int]]:
    for i, p in enumerate(prompts):
        eng.add_request(p, params, req_id=str(i))
    out = {}
    while eng.has_unfinished_requests():
        out.update({o.req_id: list(o.outputs[0].token_ids) for o in eng.step()})
    return out


def _assert_sites(audit: SyncAudit, hot: set) -> None:
    assert audit.steps > 0
    found, want = audit.sites(), REFERENCE_TWINS | hot
    assert found == want, f"new: {sorted(found - want)}\ngone: {sorted(want - found)}\n{audit.report()}"


def test_a_sync_planted_in_a_step_is_reported_with_its_location(untied):
    eng = make_engine(untied, async_scheduling=True)
    runner = eng.runner
    for i, p in enumerate(random_prompts([6, 9], seed=4)):
        eng.add_request(p, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), req_id=str(i))
    seen = []

    def hook(req_ids: list[str], logits: torch.Tensor) -> None:
        num_tokens = runner.req_state.tables()["num_tokens"]
        longest = int(num_tokens.max())  # planted: Tensor.__int__: device value read
        num_tokens[num_tokens >= longest]  # planted: Tensor.__getitem__: boolean mask
        # host work from here on, none of it a sync
        rows = torch.tensor([runner.req_state.req_id_to_row[r] for r in req_ids])
        on_device = rows.to(logits.device, non_blocking=True)
        first = runner.inputs.host.cpu[: len(rows)].tolist()  # the input rows' host mirror
        seen.append((audit.is_device(logits), audit.is_device(on_device), audit.is_device(rows), first))

    remove = eng.debug.on_logits(hook)
    with count_host_syncs(runner, roots=(*DEFAULT_ROOTS, "tests/")) as audit:
        _steps(eng)
    remove()
    assert "execute_model" not in vars(runner)  # the wrap is gone
    src, first_line = inspect.getsourcelines(hook)
    planted = {(HERE, first_line + i, "hook", line.split("# planted: ")[1].strip())
               for i, line in enumerate(src) if "# planted: " in line}
    mine = [e for e in audit.events if e.path == HERE]
    assert {(e.path, e.line, e.func, e.op) for e in mine} == planted, audit.report()
    assert len(mine) == 2 * len(seen) and len(seen) >= 4
    assert all("core_runner/runner/model_runner.py" in e.stack[1] and "in _run" in e.stack[1] for e in mine)
    # the logits are device data (taint went through the model); the hook's own H2D copy is,
    # its host tensor and the host mirror are not
    assert all(s[:3] == (True, True, False) for s in seen)
    assert sorted(seen[0][3]) == [0, 1]
    # the engine reads each step's results after it (AsyncOutput.get): not audited
    assert not any(e.path == "core_runner/runner/async_output.py" for e in audit.events)
    assert {e.site for e in audit.events if e.path != HERE} == REFERENCE_TWINS, audit.report()


def test_decode_steps(untied):
    """Greedy, seeded top-k/top-p, penalties, logit bias, min_tokens and logprobs, decoding."""
    eng = make_engine(untied, async_scheduling=True)
    params = [
        SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=0.8, top_k=20, top_p=0.9, min_p=0.01, seed=1, logprobs=2,
                       ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5,
                       presence_penalty=0.2, logit_bias={5: 2.0}, min_tokens=3, stop_token_ids=[9], ignore_eos=True),
    ]
    for i, (p, sp) in enumerate(zip(random_prompts([5, 11, 8], seed=3), params)):
        eng.add_request(p, sp, req_id=str(i))
    _steps(eng, 1)  # every prompt in one step
    with count_host_syncs(eng.runner) as audit:
        _steps(eng)
    assert audit.steps == 5  # 6 tokens: the first came with the prompt
    _assert_sites(audit, HOT_PATH["decode"])


def test_prefill_chunk_steps(untied):
    """Prompts split over chunks of 8 tokens, with prompt logprobs."""
    eng = make_engine(untied, max_num_batched_tokens=8, async_scheduling=True)
    for i, p in enumerate(random_prompts([21, 13], seed=5)):
        eng.add_request(p, SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=1, ignore_eos=True),
                        req_id=str(i))
    with count_host_syncs(eng.runner) as audit:
        _steps(eng, 4)  # 32 of the 34 prompt tokens
    assert audit.steps == 4
    _assert_sites(audit, HOT_PATH["prefill"])


def _exact_lengths(eng, exact: bool) -> None:
    """The torch backend asks for exact host lengths; ``exact=False`` runs the branch a
    graph-capable backend takes (the torch backend then reads upper bounds: outputs are
    not checked there, only which syncs the branch has)."""
    runner = eng.runner
    assert runner.exact_host_lengths and (runner.drafter is None or runner.drafter.exact_host_lengths)
    runner.exact_host_lengths = exact
    if runner.drafter is not None:
        runner.drafter.exact_host_lengths = exact


BRANCHES = pytest.mark.parametrize("exact", [True, False], ids=["torch-backend", "graph-backend-branch"])


@BRANCHES
def test_ngram_speculative_steps(untied, exact):
    prompts = [[7, 8, 9] * 6, [40, 41, 42, 43] * 4 + random_prompts([5], seed=6)[0]]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    eng = make_engine(untied, speculative_config=ngram(3), async_scheduling=True)
    _exact_lengths(eng, exact)
    with count_host_syncs(eng.runner) as audit:
        tokens = _generate(eng, prompts, params)
    assert eng.scheduler.spec_num_draft_tokens > 0  # verification steps ran
    _assert_sites(audit, HOT_PATH["ngram"] | (EXACT_LENGTHS["ngram"] if exact else set()))
    if exact:  # the audit changes nothing the engine computes
        plain = make_engine(untied, speculative_config=ngram(3), async_scheduling=True)
        assert _generate(plain, prompts, params) == tokens


@BRANCHES
def test_draft_model_speculative_steps(untied, tmp_path, exact):
    draft = write_draft(tmp_path / "draft", {**TINY, "tie_word_embeddings": False})
    config = EngineConfig(model=untied.path, dtype="float32", device="cpu", max_model_len=128, max_num_seqs=8,
                          block_size=4, num_kv_blocks=260, async_scheduling=True,
                          speculative_config={"method": "eagle", "num_speculative_tokens": 3, "model": draft})
    eng = LLMEngine(config, plugins_with_draft())
    _exact_lengths(eng, exact)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    with count_host_syncs(eng.runner) as audit:
        _generate(eng, random_prompts([5, 12], seed=3), params)
    assert eng.scheduler.spec_num_draft_tokens > 0
    _assert_sites(audit, HOT_PATH["draft"] | (EXACT_LENGTHS["draft"] if exact else set()))
