"""Triton kernels, each beside the torch reference it is tested against."""
