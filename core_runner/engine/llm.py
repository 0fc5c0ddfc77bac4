"""LLM: the public offline API (vLLM-style)."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from core_runner.config import EngineConfig
from core_runner.engine.defaults import MemoryProbe
from core_runner.engine.input_processor import PROMPT_FORMS, Prompt
from core_runner.engine.llm_engine import LLMEngine
from core_runner.engine.outputs import RequestOutput
from core_runner.engine.request import Request
from core_runner.plugins import PluginManager
from core_runner.pooling_params import PoolingParams
from core_runner.sampling_params import SamplingParams


class LLM:
    """Load a checkpoint through its plugin and generate.

    >>> llm = LLM(model="path/to/checkpoint", dtype="float32", device="cpu")
    >>> outs = llm.generate(["Hello"], SamplingParams(max_tokens=8, temperature=0.0))

    A prompt is a str, a list of int token ids, ``{"prompt": str}`` or
    ``{"prompt_token_ids": list[int]}`` (vLLM's TextPrompt / TokensPrompt).

    Threads: ``generate`` and ``embed`` hold the engine's lock for the whole call, so
    callers on several threads run one after another, each getting its own complete
    outputs. A call steps the engine only until its own requests finish; requests added
    directly with ``llm.engine.add_request`` run alongside, and the outputs of any that
    finish meanwhile are kept for ``llm.engine.step()`` (vLLM's ``LLM`` instead drains the
    engine and returns them mixed in). A call interrupted (Ctrl-C) aborts its own
    unfinished requests, so they cannot run in a later call.
    """

    def __init__(
        self, model: str, *, plugins: PluginManager | None = None,
        memory_probe: MemoryProbe | None = None, **options: Any,
    ) -> None:
        """``options`` are EngineConfig fields; ``memory_probe`` goes to LLMEngine (it reads
        the (free, total) memory the KV pool is sized from when ``num_kv_blocks`` is None)."""
        if "max_model_len" not in options:  # default: min(EngineConfig's default, the model's positions)
            default = next(f.default for f in fields(EngineConfig) if f.name == "max_model_len")
            limit = _max_positions(model)
            if limit is not None and limit < default:
                options["max_model_len"] = limit
        self.config = EngineConfig(model=str(model), **options)
        self.engine = LLMEngine(self.config, plugins=plugins, memory_probe=memory_probe)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """A new SamplingParams holding the defaults ``generate`` uses when given none (as
        vLLM's): its own defaults overridden by the checkpoint's generation_config.json
        (temperature, top_k, top_p, min_p, repetition_penalty, max_new_tokens as
        max_tokens) unless ``generation_config="vllm"``. To change one field and keep the
        checkpoint's others, edit the returned object; a SamplingParams built by hand is
        used exactly as given."""
        return self.engine.default_sampling_params()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Outputs in prompt order. Without ``sampling_params`` every prompt gets
        ``get_default_sampling_params()``. Every prompt is validated before any runs: a bad
        one raises ValueError naming its index, and nothing is left queued."""
        self._require_task("generate", "generate")
        prompts = _prompt_list(prompts)
        if sampling_params is None:
            params = [self.get_default_sampling_params()] * len(prompts)
        elif isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(
                    f"got {len(params)} SamplingParams for {len(prompts)} prompts: pass one, or one per prompt"
                )
        with self.engine.lock:
            reqs = self._process(prompts, lambda p, i: self.engine.input_processor.process(p, params[i]))
            return self._run(reqs, use_tqdm)

    def embed(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """One vector per prompt, in prompt order: ``outputs[i].embedding`` is a float32 CPU
        tensor (L2-normalised unless ``PoolingParams(normalize=False)``). Every prompt is
        validated (and text truncated, if asked) before any runs; a bad one raises
        ValueError naming its index."""
        self._require_task("embed", "embed")
        prompts = _prompt_list(prompts)
        if pooling_params is None or isinstance(pooling_params, PoolingParams):
            params = [pooling_params or PoolingParams()] * len(prompts)
        else:
            params = list(pooling_params)
            if len(params) != len(prompts):
                raise ValueError(
                    f"got {len(params)} PoolingParams for {len(prompts)} prompts: pass one, or one per prompt"
                )
        with self.engine.lock:
            reqs = self._process(prompts,
                                 lambda p, i: self.engine.input_processor.process(p, pooling_params=params[i]))
            outs = self._run(reqs, use_tqdm)
        if outs:  # one device-to-host copy for all vectors
            host = torch.stack([o.embedding for o in outs]).float().cpu()
            for o, e in zip(outs, host.unbind(0)):
                o.embedding = e
        return outs

    @staticmethod
    def _process(prompts: list, make: Callable[[Any, int], Request]) -> list[Request]:
        """Every prompt validated before any is queued; an error names the prompt's index."""
        reqs = []
        for i, p in enumerate(prompts):
            try:
                reqs.append(make(p, i))
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from e
        return reqs

    def _require_task(self, task: str, method: str) -> None:
        if task not in self.engine.tasks:
            other = {"generate": "embed", "embed": "generate"}.get(task)
            hint = f"; use LLM.{other}()" if other in self.engine.tasks else ""
            raise ValueError(
                f"LLM.{method}() needs a model with task {task!r}, but {self.engine.architecture} "
                f"supports {self.engine.tasks}{hint}"
            )

    def _run(self, reqs: list[Request], use_tqdm: bool) -> list[RequestOutput]:
        """Queue ``reqs`` and step until each has finished (the caller holds the engine's
        lock); other requests' outputs are kept for ``engine.step()``."""
        engine = self.engine
        ids = [r.req_id for r in reqs]
        done: dict[str, RequestOutput] = {}
        others: list[RequestOutput] = []
        pending: set[str] = set()  # only ids this call queued: an id clash must not abort another's request
        bar = tqdm(total=len(ids), disable=not use_tqdm, desc="requests")
        try:
            for r in reqs:
                engine.add_processed(r)
                pending.add(r.req_id)
            while pending:
                if not engine.core.has_unfinished():
                    raise RuntimeError(f"the engine has nothing left to run but requests {sorted(pending)} never "
                                       "finished (an engine bug)")
                for out in engine.step_core():
                    if out.req_id in pending:
                        pending.discard(out.req_id)
                        done[out.req_id] = out
                        bar.update(1)
                    else:
                        others.append(out)
        except BaseException:
            for req_id in pending:  # so that an interrupted call leaves nothing of its own queued
                engine.abort_request(req_id)
            engine.core.forget(pending)
            raise
        finally:
            engine.hold(others)
            bar.close()
        return [done[i] for i in ids]


def _prompt_list(prompts: Any) -> list:
    """The prompts of a call as a list: one prompt (a str, a dict or a list of ints) or a
    list of them."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        if prompts and isinstance(prompts[0], int) and not isinstance(prompts[0], bool):
            return [prompts]
        return list(prompts)
    raise ValueError(f"prompts of type {type(prompts).__name__} are not accepted: expected one prompt "
                     f"({PROMPT_FORMS}) or a list of them")


def _max_positions(model: str | Path) -> int | None:
    """The checkpoint's max_position_embeddings (None when unknown)."""
    try:
        value = json.loads((Path(model) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None
