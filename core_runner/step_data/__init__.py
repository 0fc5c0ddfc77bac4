"""Ground floor: the data one step carries between engine, runner, sampler and ModelStates.

Nothing here imports another layer of core_runner (only config-free value types), so the
engine, the runner, the sampler and plugins can all depend on it without cycles.
"""
