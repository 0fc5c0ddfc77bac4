"""Sampling: ``sample(logits, batch, state, use_triton)`` and the per-row ``SamplingState``."""
from core_runner.sample.sampler import SamplerOutput, SamplingState, StepInputs, sample, sample_inputs

__all__ = ["SamplerOutput", "SamplingState", "StepInputs", "sample", "sample_inputs"]
