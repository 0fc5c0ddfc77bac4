from core_runner.sample.sampler import Sampler, SamplerOutput

__all__ = ["Sampler", "SamplerOutput"]
