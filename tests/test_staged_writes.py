"""StagedWriteTensor: staged runs and scalars land where a plain assignment would put them,
bit-exact for every table dtype, in staging order; values a dtype cannot hold fail as before."""
from __future__ import annotations

import random

import pytest
import torch

from core_runner.step_data.buffers import StagedWriteTensor


@pytest.mark.parametrize("dtype,values", [
    (torch.int32, [0, -5, 2**31 - 1, 7]),
    (torch.int64, [2**40, -3, 0]),
    (torch.float32, [0.5, -1e-30, float("inf"), 3.25]),
    (torch.float64, [1e300, -0.0, 2.5]),
])
def test_staged_writes_land_bit_exact(dtype, values):
    t = StagedWriteTensor((2, 4), dtype, "cpu")
    t.stage_write(1, 0, values)
    t.apply_staged_writes()
    want = torch.zeros((2, 4), dtype=dtype)
    want[1, :len(values)] = torch.tensor(values, dtype=dtype)
    assert torch.equal(t.gpu, want)
    assert t.gpu[1, 1].item() == torch.tensor(values[1], dtype=dtype).item()


def test_values_an_array_refuses_go_through_torch():
    t = StagedWriteTensor((3,), torch.float32, "cpu")
    t.stage_scalar(0, 1)  # an int in a float table: an array('f') takes it, torch would too
    t.stage_scalar(2, True)
    t.apply_staged_writes()
    assert t.gpu.tolist() == [1.0, 0.0, 1.0]
    ints = StagedWriteTensor((2,), torch.int64, "cpu")
    ints.stage_scalar(1, 2**63)  # past int64: the error torch.tensor raised before
    with pytest.raises((RuntimeError, ValueError, OverflowError), match="[Oo]verflow"):
        ints.apply_staged_writes()
    assert not ints.has_staged


def test_random_runs_and_scalars_match_plain_assignment():
    rng = random.Random(3)
    for dtype in (torch.int32, torch.int64, torch.float32):
        t = StagedWriteTensor((6, 9), dtype, "cpu")
        want = torch.zeros((6, 9), dtype=dtype)
        for _ in range(4):  # several flushes, each with many runs (a later write to a cell wins)
            for _ in range(rng.randrange(1, 30)):
                row = rng.randrange(6)
                if rng.random() < 0.3:
                    v = rng.randrange(-50, 50)
                    t.stage_scalar(row, v)
                    want[row, 0] = v
                else:
                    start = rng.randrange(9)
                    vals = [rng.randrange(-1000, 1000) for _ in range(rng.randrange(0, 10 - start))]
                    t.stage_write(row, start, vals)
                    want[row, start:start + len(vals)] = torch.tensor(vals, dtype=dtype)
            t.apply_staged_writes()
            assert not t.has_staged
            assert torch.equal(t.gpu, want)
