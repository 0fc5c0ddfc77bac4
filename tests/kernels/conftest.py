"""Kernel tests run on the GPU when there is one, else in Triton's CPU interpreter.

The interpreter is chosen by TRITON_INTERPRET, which Triton reads when a kernel is
decorated, so it is set here, before any test module imports a kernel.
"""
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(params=["cuda" if HAS_CUDA else "cpu"])
def device(request) -> str:
    return request.param
