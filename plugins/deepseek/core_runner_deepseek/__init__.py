"""DeepSeek-V2/V3 family for core-runner (registered through the ``core_runner`` entry point)."""
