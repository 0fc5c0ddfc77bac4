"""InputProcessor: a prompt and its parameters become one validated Request, once.

Tokenisation, prompt checks, the checks of SamplingParams that need this engine (the
vocabulary, max_logprobs, a tokenizer for stop strings), PoolingParams resolution and
the request's seed all happen here, so the offline ``LLM``, ``LLMEngine.add_request`` and
a server share one path and nothing is validated twice.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Any, Callable, Mapping, Sequence

from core_runner.config import EngineConfig
from core_runner.engine.request import Request
from core_runner.pooling_params import POOLING_TASKS, PoolingParams
from core_runner.sampling_params import AtMost, SamplingParams
from core_runner.structured_outputs.manager import StructuredOutputManager

# vLLM's prompt forms: text, token ids, TextPrompt and TokensPrompt
Prompt = str | Sequence[int] | Mapping[str, Any]
PROMPT_FORMS = 'a str, a list of int token ids, {"prompt": str} or {"prompt_token_ids": list[int]}'


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def parse_prompt(prompt: Any) -> str | list[int]:
    """The text or token ids of one prompt in any accepted form; anything else raises a
    ValueError naming its type and the accepted forms (bytes and arrays are refused rather
    than read as token ids)."""
    if isinstance(prompt, Mapping):
        keys = set(prompt)
        if keys == {"prompt"} and isinstance(prompt["prompt"], str):
            return _valid_text(prompt["prompt"])
        if "prompt_token_ids" in keys and keys <= {"prompt", "prompt_token_ids"}:  # ids may carry their text
            return _token_ids(prompt["prompt_token_ids"], 'the "prompt_token_ids" value')
        raise ValueError(f"a dict prompt with keys {sorted(keys, key=str)} is not accepted: expected {PROMPT_FORMS}")
    if isinstance(prompt, str):
        return _valid_text(prompt)
    if isinstance(prompt, (list, tuple)):
        return _token_ids(prompt, "a token-id prompt")
    raise ValueError(f"a prompt of type {_describe(prompt)} is not accepted: expected {PROMPT_FORMS}")


def _valid_text(text: str) -> str:
    """The text, if it can be encoded (a lone surrogate such as '\\ud800', which JSON and Python
    strings allow, cannot: the tokenizer would raise a TypeError)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"a text prompt must be valid Unicode: character {e.start} is a lone surrogate "
                         f"(U+{ord(text[e.start]):04X}); encode the text properly or pass token ids") from None
    return text


def _token_ids(ids: Any, what: str) -> list[int]:
    if not isinstance(ids, (list, tuple)):
        raise ValueError(f"{what} must be a list of ints, got {_describe(ids)}; expected {PROMPT_FORMS}")
    if set(map(type, ids)) <= {int}:  # the common case, checked without a Python loop over the ids
        return list(ids)
    for i, t in enumerate(ids):
        if not isinstance(t, int) or isinstance(t, bool):
            raise ValueError(f"{what} must be a list of ints, but element {i} is {_describe(t)} "
                             f"(numpy values: pass array.tolist()); expected {PROMPT_FORMS}")
    return list(ids)


def prompt_text(prompt: Prompt) -> str | None:
    """The prompt's text when it was given as text (RequestOutput.prompt), else None."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Mapping) and isinstance(prompt.get("prompt"), str):
        return prompt["prompt"]
    return None


class InputProcessor:
    def __init__(
        self, config: EngineConfig, *, architecture: str, tasks: tuple[str, ...], tokenizer: Any,
        vocab_size: int | None, eos_token_ids: tuple[int, ...], max_positions: int | None,
        chunked_prefill: bool, resolve_pooling: Callable[[PoolingParams], PoolingParams] | None = None,
    ) -> None:
        self.config = config
        self.architecture = architecture
        self.tasks = tasks
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.max_positions = max_positions
        self.chunked_prefill = chunked_prefill
        self.resolve_pooling = resolve_pooling
        self._seed_rng = random.Random(config.seed)
        self._ids = itertools.count()
        self._structured: StructuredOutputManager | None = None

    def next_request_id(self) -> str:
        return str(next(self._ids))

    # ---- one request --------------------------------------------------------------
    def process(
        self, prompt: Prompt, params: SamplingParams | None = None, req_id: str | None = None,
        pooling_params: PoolingParams | None = None,
    ) -> Request:
        """The validated Request for one prompt; a bad prompt or parameter raises ValueError
        (TypeError for a wrong type) and nothing is queued."""
        if params is None and pooling_params is None and "generate" not in self.tasks:
            pooling_params = PoolingParams()
        if pooling_params is not None:
            if params is not None:
                raise ValueError("a request takes SamplingParams or PoolingParams, not both")
            pooling_params = self.check_pooling_params(pooling_params)
            ids = self.pooling_prompt(prompt, pooling_params)
        else:
            params = params if params is not None else SamplingParams()
            self.validate_params(params)
            ids = self.tokenize(prompt)
            self.validate_prompt(ids)
            params = self.fit_max_tokens(params, len(ids))
        seed = params.seed if params is not None and params.seed is not None else self._seed_rng.getrandbits(63)
        grammar = None
        if params is not None and params.structured_outputs is not None:
            grammar = self.structured_outputs().request(params.structured_outputs, self.eos_token_ids)
        return Request(
            req_id=req_id if req_id is not None else self.next_request_id(), prompt_token_ids=ids,
            sampling_params=params, seed=seed, eos_token_ids=self.eos_token_ids, pooling_params=pooling_params,
            prompt=prompt_text(prompt), prefix_cacheable=prefix_cacheable(params, pooling_params),
            speculative=speculative(params), structured_output=grammar,
        )

    def structured_outputs(self) -> StructuredOutputManager:
        """The grammar compiler of this engine's tokenizer (built on first use)."""
        if self._structured is None:
            self._structured = StructuredOutputManager(self.tokenizer, self.vocab_size or len(self.tokenizer))
        return self._structured

    # ---- prompts ------------------------------------------------------------------
    def tokenize(self, prompt: Prompt, truncate: int | None = None) -> list[int]:
        """Token ids of a prompt; ``truncate`` cuts a text prompt with the tokenizer's own
        truncation (special tokens kept)."""
        return self._ids_of(parse_prompt(prompt), truncate)

    def _ids_of(self, prompt: str | list[int], truncate: int | None) -> list[int]:
        """``tokenize`` of a prompt ``parse_prompt`` has already read (its ids are checked)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this checkpoint has no tokenizer: pass prompts as lists of token ids")
            if truncate is not None:
                return list(self.tokenizer.encode(prompt, truncation=True, max_length=truncate))
            return list(self.tokenizer.encode(prompt))
        return prompt

    def _check_ids(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt is empty: at least one token is needed")
        if self.vocab_size is not None and (min(ids) < 0 or max(ids) >= self.vocab_size):
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")

    def validate_prompt(self, ids: list[int]) -> None:
        self._check_ids(ids)
        limit = self.config.max_model_len - 1
        if len(ids) > limit:
            raise ValueError(
                f"prompt has {len(ids)} tokens but max_model_len={self.config.max_model_len} allows at most "
                f"{limit} (one position is needed for the first generated token)"
            )

    def fit_max_tokens(self, params: SamplingParams, num_prompt: int) -> SamplingParams:
        """``max_tokens`` against what ``max_model_len`` leaves after the prompt: None means all
        of it (vLLM), an ``AtMost`` (the defaults are) is cut to it, a plain int above
        it is refused, with both numbers, as vLLM's server refuses it."""
        room = self.config.max_model_len - num_prompt
        v = params.max_tokens
        if v is None or (isinstance(v, AtMost) and v > room):
            return dataclasses.replace(params, max_tokens=room)
        if v > room:
            raise ValueError(
                f"SamplingParams.max_tokens={v} is too large: the prompt has {num_prompt} tokens and max_model_len is "
                f"{self.config.max_model_len}, which leaves at most {room} ({v} > {self.config.max_model_len} - "
                f"{num_prompt}); lower max_tokens, or pass None to generate until max_model_len")
        return params

    def validate_params(self, params: SamplingParams) -> None:
        """The checks SamplingParams cannot make alone: they need this engine."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if "generate" not in self.tasks:
            raise ValueError(f"{self.architecture} supports tasks {self.tasks}, not 'generate'")
        if params.n != 1:
            raise ValueError(f"SamplingParams.n={params.n} is invalid here: one engine request is one sample; "
                             "LLM.generate fans n > 1 out into n requests")
        limit = self.config.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and k > limit:
                raise ValueError(f"SamplingParams.{name}={k} is invalid: expected at most max_logprobs={limit} "
                                 "(raise EngineConfig.max_logprobs)")
        if self.vocab_size is not None:
            for name, ids in (("logit_bias", params.logit_bias or ()), ("stop_token_ids", params.stop_token_ids)):
                bad = [t for t in ids if t >= self.vocab_size]
                if bad:
                    raise ValueError(f"SamplingParams.{name} token id {bad[0]} is invalid: expected ids in "
                                     f"[0, {self.vocab_size}) (the vocabulary)")
        if params.stop and self.tokenizer is None:
            raise ValueError(f"SamplingParams.stop={params.stop!r} is invalid: stop strings need a tokenizer, "
                             "and this checkpoint has none (use stop_token_ids)")

    # ---- pooling (embedding) requests -----------------------------------------------
    # One model per engine: an engine whose model embeds takes only pooling requests and a
    # generating one only sampling requests, so a batch never mixes the two.
    def check_pooling_params(self, pooling_params: Any) -> PoolingParams:
        """The request's PoolingParams with the model's default pooling type filled in."""
        if not isinstance(pooling_params, PoolingParams):
            raise TypeError(f"pooling_params must be PoolingParams, got {type(pooling_params).__name__}")
        pooling_tasks = [t for t in self.tasks if t in POOLING_TASKS]
        task = pooling_params.task or (pooling_tasks[0] if pooling_tasks else "embed")
        if task not in pooling_tasks:
            raise ValueError(
                f"{self.architecture} supports tasks {self.tasks}, not {task!r}: this pooling request needs a "
                f"model serving {task!r} (one model per engine; start a second engine for it)"
            )
        if pooling_params.task != task:
            pooling_params = dataclasses.replace(pooling_params, task=task)
        return self.resolve_pooling(pooling_params) if self.resolve_pooling is not None else pooling_params

    def pooling_prompt_limit(self) -> int:
        """Most tokens a pooling prompt may hold: max_model_len (no generated token follows),
        less one where chunked prefill is on (the scheduler never continues a request that
        has reached max_model_len)."""
        c = self.config.max_model_len
        return c - 1 if self.chunked_prefill else c

    def pooling_prompt(self, prompt: Prompt, pp: PoolingParams) -> list[int]:
        """Token ids of a pooling prompt, truncated (text) and validated."""
        prompt = parse_prompt(prompt)  # its text or ids, read and checked once
        limit = self.pooling_prompt_limit()
        k = pp.truncate_prompt_tokens
        k = limit if k == -1 else k
        ids = self._ids_of(prompt, truncate=k if isinstance(prompt, str) else None)
        if k is not None and len(ids) > k:
            raise ValueError(
                f"prompt has {len(ids)} token ids but truncate_prompt_tokens={k}: token-id prompts are not cut "
                "(only text prompts are truncated, by the tokenizer)"
            )
        self._check_ids(ids)
        if len(ids) > limit:
            why = f"max_model_len={self.config.max_model_len}"
            if self.max_positions is not None:
                why += f"; {self.architecture} has max_position_embeddings={self.max_positions}"
            raise ValueError(
                f"prompt has {len(ids)} tokens but this engine embeds at most {limit} ({why}); "
                "shorten it or pass PoolingParams(truncate_prompt_tokens=...) for a text prompt"
            )
        return ids


def prefix_cacheable(params: SamplingParams | None, pooling: PoolingParams | None) -> bool:
    """Whether a request may start from cached blocks: not when it asks for prompt
    logprobs (the cached positions' logits are never computed) nor when its pooling reads
    hidden states of every prompt token (mean) or of the first (cls); last-token pooling
    and generation need only the positions they compute. Any request still fills the
    cache for others."""
    if params is not None and params.prompt_logprobs is not None:
        return False
    return pooling is None or pooling.pooling_type == "last"


def speculative(params: SamplingParams | None) -> bool:
    """Whether a request's tokens may be verified several at a time (speculative decoding):
    its sampling must be a function of the position alone. Penalties and min_tokens depend
    on the tokens generated before each position, logprobs are reported per sampled token
    by a path that samples one position per request, and pooling samples nothing; such a
    request decodes one token per step (reported by ``RequestOutput.num_draft_tokens`` 0)."""
    if params is None:
        return False
    return (params.repetition_penalty == 1.0 and params.frequency_penalty == 0.0 and params.presence_penalty == 0.0
            and not params.logit_bias and params.min_tokens == 0 and params.logprobs is None)
