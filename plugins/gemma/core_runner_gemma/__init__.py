"""Gemma 2 and Gemma 3 (text) families for core-runner (registered through the
``core_runner`` entry point)."""
