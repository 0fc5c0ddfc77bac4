"""A cross-encoder pair's token types pass on as the first type-1 token (vLLM's
compressed_token_type_ids): 0s then 1s only; anything else is refused by name."""
import pytest

from core_runner.engine.score import _with_segment


def test_two_segments_give_the_start_of_the_second():
    assert _with_segment([5, 6, 7, 8, 9], [0, 0, 0, 1, 1]) == ([5, 6, 7, 8, 9], 3)
    assert _with_segment([5, 6], (1, 1)) == ([5, 6], 0)


def test_no_types_or_no_second_segment_give_none():
    assert _with_segment([5, 6], None) == ([5, 6], None)
    assert _with_segment([5, 6], []) == ([5, 6], None)
    assert _with_segment([5, 6], [0, 0]) == ([5, 6], None)


@pytest.mark.parametrize("types", [[0, 1, 0], [0, 1, 1, 2], [1, 0], [0, 2, 1]])
def test_other_type_patterns_are_refused(types):
    with pytest.raises(ValueError, match="only 0s then 1s"):
        _with_segment(list(range(len(types))), types)
