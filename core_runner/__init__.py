"""core-runner: a plugin-based LLM execution core (see DESIGN.md)."""
from core_runner.config import EngineConfig
from core_runner.engine.llm import LLM
from core_runner.engine.llm_engine import LLMEngine
from core_runner.engine.outputs import RequestOutput
from core_runner.plugins import hookimpl
from core_runner.pooling_params import PoolingParams
from core_runner.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = [
    "EngineConfig", "LLM", "LLMEngine", "PoolingParams", "RequestOutput", "SamplingParams", "hookimpl", "__version__",
]
