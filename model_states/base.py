"""The ModelState ABC lives in ``core_runner.model_state`` (exported by ``core_runner.sdk``);
this name stays for the layout DESIGN.md describes."""
from core_runner.sdk import ModelState

__all__ = ["ModelState"]
