"""LLM: the public offline API (vLLM-style)."""
from __future__ import annotations

from typing import Any, Sequence

from tqdm.auto import tqdm

from core_runner.config import EngineConfig
from core_runner.engine.llm_engine import LLMEngine
from core_runner.engine.outputs import RequestOutput
from core_runner.plugins import PluginManager
from core_runner.sampling_params import SamplingParams

Prompt = str | Sequence[int]


class LLM:
    """Load a checkpoint through its plugin and generate.

    >>> llm = LLM(model="path/to/checkpoint", dtype="float32", device="cpu")
    >>> outs = llm.generate(["Hello"], SamplingParams(max_tokens=8, temperature=0.0))
    """

    def __init__(self, model: str, *, plugins: PluginManager | None = None, **options: Any) -> None:
        self.config = EngineConfig(model=str(model), **options)
        self.engine = LLMEngine(self.config, plugins=plugins)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Outputs in prompt order. Every prompt is validated before any runs: a bad one
        raises ValueError naming its index, and nothing is left queued."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            params = [SamplingParams()] * len(prompts)
        elif isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(
                    f"got {len(params)} SamplingParams for {len(prompts)} prompts: pass one, or one per prompt"
                )
        token_prompts = []
        for i, p in enumerate(prompts):
            try:
                ids = self.engine.tokenize(p)
                self.engine.validate_prompt(ids)
            except ValueError as e:
                raise ValueError(f"prompt {i}: {e}") from e
            token_prompts.append(ids)
        ids = [self.engine.add_request(p, sp) for p, sp in zip(token_prompts, params)]
        return self._run(ids, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), disable=not use_tqdm, desc="requests")
        wanted = set(ids)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.req_id in wanted:
                    done[out.req_id] = out
                    bar.update(1)
        bar.close()
        return [done[i] for i in ids]
