"""LLM: the public offline API (vLLM-style)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from core_runner.config import EngineConfig
from core_runner.engine.defaults import MemoryProbe
from core_runner.engine.input_processor import PROMPT_FORMS, Prompt
from core_runner.engine.llm_engine import LLMEngine
from core_runner.engine.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringRequestOutput,
)
from core_runner.engine.request import Request
from core_runner.executor.gc_heap import paused_gc
from core_runner.plugins import PluginManager
from core_runner.pooling_params import POOLING_TASKS, PoolingParams
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
        memory_probe: MemoryProbe | None = None, logits_processors: list | tuple = (), **options: Any,
    ) -> None:
        """``options`` are EngineConfig fields; ``memory_probe`` goes to LLMEngine (it reads
        the (free, total) memory the KV pool is sized from when ``num_kv_blocks`` is None)."""
        if "max_model_len" not in options:  # default: min(EngineConfig's default, the model's positions)
            default = next(f.default for f in fields(EngineConfig) if f.name == "max_model_len")
            limit = _max_positions(model, plugins)
            if limit is not None and limit < default:
                options["max_model_len"] = limit
        self.config = EngineConfig(model=str(model), **options)
        self.engine = LLMEngine(self.config, plugins=plugins, memory_probe=memory_probe,
                                logits_processors=logits_processors)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block (vLLM's name); True when prefix caching is on."""
        return self.engine.reset_prefix_cache()

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
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in prompt order; ``outputs`` holds
        ``SamplingParams.n`` samples (run as n requests, seeded ``seed + i`` when seeded).
        A prompt is a str, a list of token ids, ``{"prompt": str}`` or
        ``{"prompt_token_ids": [...]}``. Without ``sampling_params`` every prompt gets
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
        with self.engine.lock, paused_gc():
            groups = self._process(prompts, lambda p, i: self._fan_out(p, params[i]))
            return self._run(groups, use_tqdm)

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of ``{"role", "content"}`` messages)
        or to a list of them, rendered by the tokenizer's chat template (or
        ``chat_template``, a Jinja string; ``tools``, OpenAI's function list, is given to it).
        The rendered text is tokenized without adding special tokens (the template writes
        them) and is each output's ``prompt``."""
        self._require_task("generate", "chat")
        tok = self.tokenizer
        if tok is None:
            raise ValueError("LLM.chat() needs a tokenizer, and this checkpoint has none: render the conversation "
                             "yourself and pass token ids to LLM.generate()")
        if chat_template is None and not getattr(tok, "chat_template", None):
            raise ValueError(f"the tokenizer of {self.config.model} has no chat template (none in its "
                             "tokenizer_config.json): pass chat_template=<a Jinja template string>")
        convs = [messages] if messages and isinstance(messages[0], Mapping) else list(messages)
        prompts = []
        for i, conv in enumerate(convs):
            try:
                text = tok.apply_chat_template(list(conv), tokenize=False, chat_template=chat_template,
                                               add_generation_prompt=add_generation_prompt, tools=tools)
            except Exception as e:  # jinja's errors are not ValueErrors; name the conversation
                raise ValueError(f"conversation {i}: the chat template failed: {type(e).__name__}: {e}") from e
            prompts.append({"prompt": text, "prompt_token_ids": tok.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def embed(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[EmbeddingRequestOutput]:
        """One vector per prompt, in prompt order: ``outs[i].outputs.embedding`` is a list of
        floats (``outs[i].outputs.data`` the same as a float32 CPU tensor), L2-normalised
        unless ``PoolingParams(normalize=False)``. Every prompt is validated (and text
        truncated, if asked) before any runs; a bad one raises ValueError naming its index."""
        self._require_task("embed", "embed")
        prompts = _prompt_list(prompts)
        return self._pool(prompts, _per_prompt(pooling_params, len(prompts)), "embed", use_tqdm)

    def classify(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[ClassificationRequestOutput]:
        """Class probabilities per prompt, in prompt order (vLLM's ``LLM.classify``):
        ``outs[i].outputs.probs`` one float per label, softmax over the labels, or sigmoid
        per label when the checkpoint has ``num_labels == 1`` or ``problem_type ==
        "multi_label_classification"``; raw logits with ``PoolingParams(use_activation=
        False)``. ``outputs.id2label`` is the config's label names, ``outputs.label`` the
        most likely one's."""
        self._require_task("classify", "classify")
        prompts = _prompt_list(prompts)
        outs = self._pool(prompts, _per_prompt(pooling_params, len(prompts)), "classify", use_tqdm)
        labels = getattr(self.engine.hf_config, "id2label", None) or {}
        id2label = {int(k): str(v) for k, v in dict(labels).items()}
        for o in outs:
            if o.outputs is not None:
                o.outputs.id2label = id2label
        return outs

    def score(
        self,
        data_1: str | Sequence[str],
        data_2: str | Sequence[str],
        /,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        pooling_params: PoolingParams | None = None,
    ) -> list[ScoringRequestOutput]:
        """Relevance of text pairs (vLLM's ``LLM.score``): one text_1 against every text_2,
        or pairwise for equal lengths; ``outs[i].outputs.score`` a float. A cross-encoder
        (a classifier of one label) reads each pair through the tokenizer's pair template
        with its token types and scores it by its activated logit (sigmoid; raw with
        ``use_activation=False``); an embedding model scores the cosine of the two texts'
        embeddings."""
        from core_runner.engine import score as sc

        pairs = sc.pair_up(data_1, data_2)
        base = pooling_params or PoolingParams()
        if truncate_prompt_tokens is not None:
            base = dataclasses.replace(base, truncate_prompt_tokens=truncate_prompt_tokens)
        if "score" in self.engine.tasks:
            labels = int(getattr(self.engine.hf_config, "num_labels", 1) or 1)
            if labels != 1:
                raise ValueError(f"LLM.score() on {self.engine.architecture} needs a cross-encoder of one label, "
                                 f"but num_labels={labels}: use LLM.classify() for its {labels} probabilities")
            if self.tokenizer is None:
                raise ValueError("LLM.score() on a cross-encoder needs the checkpoint's tokenizer for the pair "
                                 "template, and this checkpoint has none")
            limit = base.truncate_prompt_tokens
            if limit == -1:
                limit = self.engine.input_processor.pooling_prompt_limit()
            prompts, params, by_start = [], [], {}  # one (frozen) PoolingParams per segment start, shared
            with paused_gc():  # the pairs' token lists are many allocations (gc_heap's docstring)
                for ids, start in sc.encode_pairs(self.tokenizer, pairs, limit):
                    prompts.append({"prompt_token_ids": ids})
                    if start not in by_start:
                        by_start[start] = dataclasses.replace(base, truncate_prompt_tokens=None,
                                                              compressed_token_type_ids=start,
                                                              task=base.task or "score")
                    params.append(by_start[start])
                return sc.cross_encoder_scores(self._pool(prompts, params, "score", use_tqdm))
        if "embed" in self.engine.tasks:
            texts = list(dict.fromkeys(t for pair in pairs for t in pair))
            outs = self._pool(texts, [base] * len(texts), "embed", use_tqdm)
            return sc.cosine_scores(pairs, dict(zip(texts, outs)))
        raise ValueError(f"LLM.score() needs a cross-encoder (task 'score') or an embedding model (task 'embed'), "
                         f"but {self.engine.architecture} supports {self.engine.tasks}")

    def reward(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[PoolingRequestOutput]:
        """A reward model's scores per prompt, in prompt order (vLLM's ``LLM.reward``):
        ``outs[i].outputs.data`` a float32 CPU tensor, ``[num_labels]`` for a last-token reward
        head (``LlamaForSequenceClassification``), ``[num_prompt_tokens, num_labels]`` for a
        per-token one (``*ForTokenClassification``). Raw scores, as vLLM's reward pooler gives;
        ``PoolingParams(use_activation=True)`` applies the head's sigmoid / softmax."""
        self._require_task("reward", "reward")
        prompts = _prompt_list(prompts)
        return self._pool(prompts, _per_prompt(pooling_params, len(prompts)), "reward", use_tqdm)

    def encode(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        pooling_task: str | None = None,
        use_tqdm: bool = True,
    ) -> list[PoolingRequestOutput]:
        """The general pooling entry (vLLM's ``LLM.encode``): one PoolingRequestOutput per
        prompt, ``outs[i].outputs.data`` a float32 CPU tensor (an embedding for ``"embed"``,
        probabilities for ``"classify"`` / ``"score"``, as ``embed`` / ``classify`` give, raw
        scores for ``"reward"``, as ``reward`` gives).
        ``pooling_task`` is one of the model's pooling tasks (None: its first); another
        raises ValueError naming the valid ones."""
        tasks = [t for t in self.engine.tasks if t in POOLING_TASKS]
        if not tasks:
            raise ValueError(f"LLM.encode() needs a pooling model, but {self.engine.architecture} supports "
                             f"{self.engine.tasks}; use LLM.generate()")
        task = tasks[0] if pooling_task is None else pooling_task
        if task not in tasks:
            raise ValueError(f"LLM.encode(pooling_task={pooling_task!r}) is invalid for {self.engine.architecture}: "
                             f"expected one of its pooling tasks {tasks}")
        prompts = _prompt_list(prompts)
        return self._pool(prompts, _per_prompt(pooling_params, len(prompts)), task, use_tqdm)

    def _pool(self, prompts: list, params: list[PoolingParams], task: str, use_tqdm: bool) -> list[Any]:
        """Run pooling requests of one task; the vectors as float32 CPU tensors."""
        for i, p in enumerate(params):
            if not isinstance(p, PoolingParams):
                raise TypeError(f"pooling_params[{i}] must be PoolingParams, got {type(p).__name__}")
            if p.task not in (None, task):
                raise ValueError(f"PoolingParams.task={p.task!r} of prompt {i} is invalid in LLM.{task}(): "
                                 f"expected None or {task!r}")
        params = [p if p.task == task else dataclasses.replace(p, task=task) for p in params]
        with self.engine.lock, paused_gc():
            reqs = self._process(prompts,
                                 lambda p, i: self.engine.input_processor.process(p, pooling_params=params[i]))
            outs = self._run([[r] for r in reqs], use_tqdm)
        # the runner hands over host tensors (runner/pooled_output.py); a third-party state may
        # pool in another dtype than float32
        for o in outs:
            if o.outputs is not None and o.outputs.data.dtype != torch.float32:
                o.outputs.data = o.outputs.data.float()
        return outs

    def _fan_out(self, prompt: Prompt, sp: SamplingParams) -> list[Request]:
        """One request per sample; n > 1 gives children ``"{i}_{parent id}"`` (vLLM's naming)."""
        ip = self.engine.input_processor
        if not isinstance(sp, SamplingParams) or sp.n == 1:
            return [ip.process(prompt, sp)]
        parent = ip.next_request_id()
        return [
            ip.process(prompt, dataclasses.replace(sp, n=1, seed=None if sp.seed is None else (sp.seed + i) % 2**63),
                       req_id=f"{i}_{parent}")
            for i in range(sp.n)
        ]

    @staticmethod
    def _process(prompts: list, make: Callable[[Any, int], Any]) -> list[Any]:
        """Every prompt validated before any is queued; an error names the prompt's index."""
        reqs = []
        for i, p in enumerate(prompts):
            try:
                reqs.append(make(p, i))
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from e
        # grammars compile in the pool meanwhile; a schema xgrammar refuses is refused here, by prompt
        for i, made in enumerate(reqs):
            for r in made if isinstance(made, list) else [made]:
                g = getattr(r, "structured_output", None)
                if g is not None and g.future.exception() is not None:
                    raise ValueError(f"prompt {i}: {g.future.exception()}")
        return reqs

    def _require_task(self, task: str, method: str) -> None:
        if task not in self.engine.tasks:
            methods = [f"LLM.{t}()" for t in self.engine.tasks
                       if t in ("generate", "embed", "classify", "score", "reward")]
            hint = f"; use {' or '.join(methods)}" if methods else ""
            raise ValueError(
                f"LLM.{method}() needs a model with task {task!r}, but {self.engine.architecture} "
                f"supports {self.engine.tasks}{hint}"
            )

    def _run(self, groups: list[list[Request]], use_tqdm: bool) -> list[Any]:
        """Queue every group's requests and step until each has finished (the caller holds
        the engine's lock); a group of n samples becomes one RequestOutput. Other callers'
        outputs are kept for ``engine.step()``."""
        engine = self.engine
        group_of = {r.req_id: g for g, group in enumerate(groups) for r in group}
        left = [len(group) for group in groups]
        done: dict[str, Any] = {}
        others: list[Any] = []
        pending: set[str] = set()  # only ids this call queued: an id clash must not abort another's request
        bar = tqdm(total=len(groups), disable=not use_tqdm, desc="Processed prompts")
        try:
            for group in groups:
                for r in group:
                    engine.add_processed(r)
                    pending.add(r.req_id)
            while pending:
                if not engine.core.has_unfinished():
                    raise RuntimeError(f"the engine has nothing left to run but requests {sorted(pending)} never "
                                       "finished (an engine bug)")
                for out in engine.step_core():
                    if out.request_id in pending:
                        pending.discard(out.request_id)
                        done[out.request_id] = out
                        g = group_of[out.request_id]
                        left[g] -= 1
                        if left[g] == 0:
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
        return [_gather([done[r.req_id] for r in group]) for group in groups]


def _gather(outs: list[Any]) -> Any:
    """n samples of one prompt as one RequestOutput, ``outputs[i].index`` = i."""
    if len(outs) == 1:
        return outs[0]
    first = outs[0]
    parent = first.request_id.split("_", 1)[1]
    completions = [dataclasses.replace(o.outputs[0], index=i) for i, o in enumerate(outs)]
    times = [o.first_token_time for o in outs if o.first_token_time is not None]
    return dataclasses.replace(
        first, request_id=parent, outputs=completions, finished=all(o.finished for o in outs),
        num_preemptions=sum(o.num_preemptions for o in outs), first_token_time=min(times, default=None),
        finish_time=max((o.finish_time for o in outs if o.finish_time is not None), default=None),
    )



def _per_prompt(pooling_params: Any, n: int) -> list[PoolingParams]:
    """One PoolingParams (or None: the defaults) for every prompt, or one per prompt."""
    if pooling_params is None or isinstance(pooling_params, PoolingParams):
        return [pooling_params or PoolingParams()] * n
    params = list(pooling_params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} PoolingParams for {n} prompts: pass one, or one per prompt")
    return params


def _prompt_list(prompts: Any) -> list:
    """The prompts of a call as a list: one prompt (a str, a dict or a list of ints) or a
    list of them."""
    if isinstance(prompts, (str, Mapping)):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        if prompts and isinstance(prompts[0], int) and not isinstance(prompts[0], bool):
            return [prompts]
        return list(prompts)
    raise ValueError(f"prompts of type {type(prompts).__name__} are not accepted: expected one prompt "
                     f"({PROMPT_FORMS}) or a list of them")


def _max_positions(model: str | Path, plugins: PluginManager | None = None) -> int | None:
    """The checkpoint's max_position_embeddings, or fewer when the family's model class says
    it places fewer tokens (``max_positions_of``; see LLMEngine); None when unknown."""
    try:
        raw = json.loads((Path(model) / "config.json").read_text())
        value = raw.get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    if not (isinstance(value, int) and value > 0):
        return None
    try:
        from transformers import AutoConfig

        from core_runner.engine.llm_engine import usable_positions
        from core_runner.plugins import load_plugins

        arch = (raw.get("architectures") or [None])[0]
        reg = (plugins or load_plugins()).registry.find(arch) if arch else None
        usable = usable_positions(reg, AutoConfig.from_pretrained(str(model))) if reg is not None else None
    except Exception:  # noqa: BLE001 - the engine reports a bad checkpoint or plugin itself
        return value
    return min(value, usable) if usable is not None else value
