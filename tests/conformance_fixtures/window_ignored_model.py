"""The Qwen3 model with every layer's sliding window dropped: full attention whatever the
config says (the bug of window_undeclared.py)."""
from __future__ import annotations

import copy

from core_runner_qwen3.model import Qwen3ForCausalLM


class Qwen3IgnoringWindows(Qwen3ForCausalLM):
    def __init__(self, config, *args, **kwargs) -> None:
        config = copy.copy(config)
        config.sliding_window = None
        super().__init__(config, *args, **kwargs)
