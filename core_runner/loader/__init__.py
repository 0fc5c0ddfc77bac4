"""Checkpoint loading: where the model is (``resolve``), its JSON files (``config``), which
safetensors files hold its tensors (``checkpoint``) and loading them into parameters
(``weights``, with the fused-part accounting of ``parts``; ``slices`` reads a rank's
region of a tensor and nothing else). Every error names the file and, for weights, the
tensor at fault and what was expected. Config values no model can run with are refused
when config.json is read (``config_checks``), weights that cannot fit before any is allocated
(``footprint``). No checkpoint code is ever run: ``trust_remote_code`` stays off and pickle
weights are refused.
"""
from core_runner.loader.checkpoint import INDEX, checkpoint_files
from core_runner.loader.config import architecture_of, eos_ids, load_hf_config, load_tokenizer
from core_runner.loader.config_checks import ConfigValueError, check_config_values
from core_runner.loader.files import CheckpointError, read_json
from core_runner.loader.footprint import Footprint, check_footprint, estimate_footprint
from core_runner.loader.resolve import hub_cache_dir, hub_offline, resolve_model, resolve_tokenizer
from core_runner.loader.slices import CheckpointSlice
from core_runner.loader.weights import Transform, build_model, load_weights

__all__ = [
    "INDEX", "CheckpointError", "CheckpointSlice", "ConfigValueError", "Footprint", "Transform", "architecture_of",
    "build_model", "check_config_values", "check_footprint", "checkpoint_files", "eos_ids", "estimate_footprint",
    "hub_cache_dir", "hub_offline", "load_hf_config", "load_tokenizer", "load_weights", "read_json", "resolve_model",
    "resolve_tokenizer",
]
