"""Request.token_view reads prompt + output as one sequence without copying: the same
length, slices and block hashes as the joined list."""
import random

import pytest

from core_runner.engine.block_hash import extend_hashes
from core_runner.engine.request import TokenView


def test_slices_equal_the_joined_list():
    rng = random.Random(0)
    for _ in range(200):
        a = [rng.randrange(100) for _ in range(rng.randrange(0, 40))]
        b = [rng.randrange(100) for _ in range(rng.randrange(0, 40))]
        joined, view = a + b, TokenView(a, b)
        assert len(view) == len(joined)
        i = rng.randrange(0, len(joined) + 1)
        j = rng.randrange(i, len(joined) + 1)
        assert view[i:j] == joined[i:j]
    assert TokenView([1, 2], [3])[:] == [1, 2, 3]


def test_block_hashes_match_the_joined_list():
    a, b = list(range(3, 40)), list(range(100, 131))
    assert extend_hashes([], TokenView(a, b), 16) == extend_hashes([], a + b, 16)


def test_only_plain_slices():
    with pytest.raises(TypeError):
        TokenView([1], [2])[0]
    with pytest.raises(TypeError):
        TokenView([1], [2])[::2]
