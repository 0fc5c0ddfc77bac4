"""ModelState: the per-family half of the runner (DESIGN.md section 3)."""
from model_states.base import ModelState
from model_states.default import DefaultModelState

__all__ = ["DefaultModelState", "ModelState"]
