"""gpt-oss family for core-runner (registered through the ``core_runner`` entry point)."""
