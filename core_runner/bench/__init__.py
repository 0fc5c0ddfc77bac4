"""Benchmarks of DESIGN.md section 8 (``core-runner bench``)."""
