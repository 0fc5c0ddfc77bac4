"""CR-BOUND-04 probes of the options that say where a checkpoint comes from (a hub id's
revision, the tokenizer's) and of pipeline_parallel_size; registered with ``options.probe``."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from core_runner.conformance.checks_bounds import expect_raises
from core_runner.conformance.harness import Ctx, fail, greedy, run
from core_runner.conformance.options import _rejects, _tiny_tokenizer, probe

_PROBE_REPO = "core-runner-conformance/probe"
_SHAS = {"main": "1" * 40, "cr-probe": "2" * 40}


class _FakeHub:
    """A throwaway Hugging Face cache holding the reference checkpoint as _PROBE_REPO:
    "main" is it unchanged, the tag "cr-probe" has another EOS id and a tiny tokenizer.
    While entered, HF_HUB_CACHE points at it and HF_HUB_OFFLINE=1."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.eos = ctx.ref.vocab - 1

    def __enter__(self) -> _FakeHub:

        self.tmp = tempfile.TemporaryDirectory(prefix="cr-hub-")
        repo = Path(self.tmp.name) / f"models--{_PROBE_REPO.replace('/', '--')}"
        src = Path(self.ctx.ref.path)
        tok = Path(_tiny_tokenizer(self.ctx.ref.vocab))
        for ref, sha in _SHAS.items():
            snap = repo / "snapshots" / sha
            snap.mkdir(parents=True)
            (repo / "refs").mkdir(exist_ok=True)
            (repo / "refs" / ref).write_text(sha)
            for f in src.iterdir():
                if ref == "main" or f.name not in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
                    (snap / f.name).symlink_to(f.resolve())
            if ref != "main":
                gen = src / "generation_config.json"
                data = json.loads(gen.read_text()) if gen.is_file() else {}
                (snap / "generation_config.json").write_text(json.dumps({**data, "eos_token_id": [self.eos]}))
                for f in tok.iterdir():
                    (snap / f.name).write_bytes(f.read_bytes())
        self.saved = {k: os.environ.get(k) for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE")}
        os.environ.update(HF_HUB_CACHE=self.tmp.name, HF_HUB_OFFLINE="1")
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.tmp.cleanup()

    def engine(self, **opts: Any) -> Any:
        from core_runner import LLM

        mml = self.ctx.max_model_len(32)
        return LLM(_PROBE_REPO, plugins=self.ctx.pm, dtype="float32", max_model_len=mml, max_num_seqs=2,
                   block_size=4, num_kv_blocks=self.ctx.pool(2 * -(-mml // 4)), strict=False, **opts).engine


@probe("revision")
def _revision(ctx: Ctx) -> str:
    text = _rejects(ctx, "revision='main' for a local checkpoint directory", revision="main")
    with _FakeHub(ctx) as hub:
        main, tagged = hub.engine().eos_token_ids, hub.engine(revision="cr-probe").eos_token_ids
        if tagged != (hub.eos,) or main == tagged:
            fail(f"model id at revision 'cr-probe' has EOS ids {tagged} (expected {(hub.eos,)}), at main {main}")
        expect_raises(lambda: hub.engine(revision="no-such-rev"), FileNotFoundError,
                      "a revision absent from the offline hub cache", match="no-such-rev")
    return f"picks the snapshot of a model id (EOS {main} at main, {tagged} at a tag); {text}"


@probe("tokenizer_revision")
def _tokenizer_revision(ctx: Ctx) -> str:
    text = _rejects(ctx, "tokenizer_revision='main' for a local tokenizer directory", tokenizer_revision="main")
    with _FakeHub(ctx) as hub:
        e = hub.engine(tokenizer_revision="cr-probe")
        ids = e.tokenizer.encode("hello core runner") if e.tokenizer is not None else None
        if ids != [4, 6, 7] or e.eos_token_ids == (hub.eos,):
            fail(f"tokenizer_revision='cr-probe' gave a tokenizer encoding 'hello core runner' as {ids} (expected "
                 f"[4, 6, 7]) and EOS ids {e.eos_token_ids} (the model must stay at main)")
    return "picks the tokenizer's snapshot of a model id, the model staying at its revision; " + text


def _one_only(ctx: Ctx, name: str) -> str:
    e = ctx.engine(**{name: 1})
    out = run(e, [("a", ctx.ref.prompts([4], seed=2)[0], greedy(2))])["a"]
    if len(out.token_ids) != 2:
        fail(f"{name}=1 (vLLM's default) did not generate")
    return f"1 runs on one device; {_rejects(ctx, f'{name}=2 (not implemented)', **{name: 2})}"


@probe("pipeline_parallel_size")
def _pipeline_parallel_size(ctx: Ctx) -> str:
    return _one_only(ctx, "pipeline_parallel_size")


@probe("trust_remote_code")
def _trust_remote_code(ctx: Ctx) -> str:
    ctx.engine(trust_remote_code=False)
    return "False is accepted (vLLM's default); " + _rejects(
        ctx, "trust_remote_code=True (a checkpoint's code never runs)", trust_remote_code=True)


@probe("load_format")
def _load_format(ctx: Ctx) -> str:
    """'dummy' needs only config.json: the example's config without its weights builds an
    engine that generates, which 'auto' refuses (no safetensors file)."""
    text = _rejects(ctx, "load_format='pt'", load_format="pt")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(ctx.ref.path) / "config.json"
        (Path(tmp) / "config.json").write_bytes(cfg.read_bytes())
        from core_runner import LLM

        opts = dict(plugins=ctx.pm, dtype="float32", device="cpu", max_model_len=ctx.max_model_len(32),
                    max_num_seqs=2, block_size=4, num_kv_blocks=ctx.pool(16), strict=False)
        expect_raises(lambda: LLM(tmp, **opts), FileNotFoundError, "load_format='auto' on a config-only directory",
                      match="safetensors")
        e = LLM(tmp, load_format="dummy", **opts).engine
        out = run(e, [("a", ctx.ref.prompts([4], seed=2)[0], greedy(2))])["a"]
        if len(out.token_ids) != 2:
            fail(f"load_format='dummy' generated {out.token_ids}")
    return "'dummy' runs a config-only directory (random weights) that 'auto' refuses; " + text
