"""Which request fields each route knows, so that no field is dropped without a word.

Every field a route reads is in its ``KNOWN`` set (the handlers check its value: honoured,
or refused with a 400 naming it, e.g. ``best_of``). Fields OpenAI or vLLM define that this
server does not implement are in ``REFUSED``: a value other than the harmless default is
a 400 naming the field, since the client would otherwise get something other than it asked
for (``use_beam_search`` ignored would return one sampled text). Any other field is
unknown: it is ignored and logged as a warning with its name, as vLLM does ("fields were
present in the request but ignored"), so a client sending a newer OpenAI field still works.
"""
from __future__ import annotations

import logging
from typing import Any

from core_runner.entrypoints.openai.protocol import APIError, _short

logger = logging.getLogger(__name__)

# fields with no effect on the output: OpenAI's end-user id and stored-completion tags
_INFORMATIONAL = {"model", "user", "metadata"}
_SAMPLING = {"max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "logprobs", "stop", "seed",
             "presence_penalty", "frequency_penalty", "logit_bias",
             # vLLM's extra sampling fields
             "top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids", "ignore_eos",
             "include_stop_str_in_output"}
# structured outputs (structured_body.py): vLLM's body field, its older guided_* names, OpenAI's
_STRUCTURED = {"structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
               "guided_whitespace_pattern", "response_format"}
_POOLING = {"input", "encoding_format", "dimensions", "truncate_prompt_tokens"}

KNOWN: dict[str, set[str]] = {
    "/v1/completions": _INFORMATIONAL | _SAMPLING | _STRUCTURED | {"prompt", "best_of", "echo", "suffix"},
    "/v1/chat/completions": _INFORMATIONAL | _SAMPLING | _STRUCTURED | {
        "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls"},
    "/v1/embeddings": _INFORMATIONAL | _POOLING,
    "/pooling": _INFORMATIONAL | _POOLING | {"task", "use_activation"},
    "/classify": _INFORMATIONAL | _POOLING | {"use_activation"},
    "/score": _INFORMATIONAL | {"text_1", "text_2", "truncate_prompt_tokens", "use_activation", "encoding_format"},
    "/rerank": _INFORMATIONAL | {"query", "documents", "top_n", "return_documents", "truncate_prompt_tokens",
                                 "use_activation"},
}
KNOWN["/v1/score"], KNOWN["/v1/rerank"] = KNOWN["/score"], KNOWN["/rerank"]

# field -> the values that mean "what this server does anyway" (None: absent); anything else is refused
_GENERATION_REFUSED: dict[str, tuple] = {
    # one structured-outputs backend (xgrammar) only
    "guided_decoding_backend": (None, "xgrammar"),
    # vLLM's other sampling extras
    "use_beam_search": (None, False), "length_penalty": (None, 1, 1.0), "prompt_logprobs": (None,),
    "allowed_token_ids": (None,), "bad_words": (None, []), "logits_processors": (None,),
    "skip_special_tokens": (None, True), "spaces_between_special_tokens": (None, True),
    "truncate_prompt_tokens": (None,), "priority": (None, 0), "return_tokens_as_token_ids": (None, False),
    "add_special_tokens": (None,),
    # OpenAI fields with no implementation here
    "store": (None, False), "service_tier": (None, "auto", "default"), "prediction": (None,),
}
REFUSED: dict[str, dict[str, tuple]] = {
    "/v1/completions": _GENERATION_REFUSED,
    "/v1/chat/completions": {
        **_GENERATION_REFUSED,
        "functions": (None, []), "function_call": (None, "none"),
        "modalities": (None, ["text"]), "audio": (None,), "reasoning_effort": (None,), "web_search_options": (None,),
        "chat_template": (None,), "chat_template_kwargs": (None, {}), "add_generation_prompt": (None, True),
        "continue_final_message": (None, False), "documents": (None,), "echo": (None, False),
    },
    "/v1/embeddings": {"add_special_tokens": (None,), "priority": (None, 0)},
}


def check_fields(path: str, body: dict[str, Any]) -> None:
    """A 400 naming the first refused field of ``body`` (for route ``path``) set to a value
    this server cannot honour; a warning naming the fields it does not know."""
    known, refused = KNOWN.get(path), REFUSED.get(path, {})
    if known is None:
        return
    for name, allowed in refused.items():
        if name in body and body[name] not in allowed:
            keep = " or ".join(repr(v) for v in allowed if v is not None)
            also = f" (or send {keep})" if keep else ""
            raise APIError(f"{name}={_short(body[name])} is not supported by this server: leave it out{also}", name)
    unknown = sorted(k for k in body if k not in known and k not in refused)
    if unknown:
        logger.warning("%s: the following fields were present in the request but ignored: %s", path,
                       ", ".join(_short(k) for k in unknown))
