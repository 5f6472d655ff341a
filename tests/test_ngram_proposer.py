"""The n-gram proposer: hand-built sequences (longest match, newest occurrence, bounds, truncation, no match,
rows of different lengths), bad arguments, and a property test against a plain-Python reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.spec_decode.ngram import NgramProposer


def _propose(seqs: list[list[int]], k: int, lo: int, hi: int, pad: int = 0) -> list[list[int]]:
    """Each row's drafts as a list, from sequences padded into one array (``pad`` extra columns of junk)."""
    width = max(map(len, seqs)) + pad
    tokens = np.full((len(seqs), width), 99, dtype=np.int32)  # junk past each row's end must be ignored
    for r, s in enumerate(seqs):
        tokens[r, :len(s)] = s
    drafts, num = NgramProposer(k, lo, hi).propose(tokens, np.array([len(s) for s in seqs], dtype=np.int32))
    assert drafts.shape == (len(seqs), k) and drafts.dtype == np.int32 and num.dtype == np.int32
    for r in range(len(seqs)):
        assert (drafts[r, num[r]:] == 0).all()  # past a row's drafts: zeros
    return [drafts[r, :num[r]].tolist() for r in range(len(seqs))]


def reference(seq: list[int], k: int, lo: int, hi: int) -> list[int]:
    """The contract in plain Python: the longest suffix n-gram (hi..lo) that occurred earlier, the tokens after
    its newest earlier occurrence."""
    L = len(seq)
    for n in range(min(hi, L - 1), lo - 1, -1):
        for i in range(L - n - 1, -1, -1):  # the newest occurrence first; i + n <= L - 1
            if seq[i:i + n] == seq[L - n:]:
                return seq[i + n:i + n + k]
    return []


def test_longest_match_wins():
    # suffix [5, 6, 7]: the 3-gram occurred once (followed by 1, 2); the 1-gram [7] also later (followed by 9)
    seq = [5, 6, 7, 1, 2, 0, 7, 9, 4, 5, 6, 7]
    assert _propose([seq], k=2, lo=1, hi=3) == [[1, 2]]
    assert _propose([seq], k=2, lo=1, hi=1) == [[9, 4]]  # only 1-grams: the newest [7]


def test_newest_occurrence_wins():
    seq = [3, 4, 10, 11, 3, 4, 20, 21, 3, 4]
    assert _propose([seq], k=2, lo=2, hi=2) == [[20, 21]]


def test_min_and_max_bounds():
    seq = [1, 2, 3, 8, 2, 3]  # the longest earlier match of a suffix is [2, 3] (2 tokens)
    assert _propose([seq], k=3, lo=3, hi=4) == [[]]  # shorter than prompt_lookup_min: nothing
    assert _propose([seq], k=3, lo=2, hi=4) == [[8, 2, 3]]
    assert _propose([seq], k=3, lo=1, hi=1) == [[8, 2, 3]]  # [3] alone: its newest earlier occurrence is at 2
    # the max bound caps the match: with hi=1 the newest [4] is the one followed by 7, not the 3-gram's 6
    seq = [2, 3, 4, 6, 0, 4, 7, 2, 3, 4]
    assert _propose([seq], k=1, lo=1, hi=3) == [[6]]
    assert _propose([seq], k=1, lo=1, hi=1) == [[7]]


def test_sequence_end_truncates_drafts():
    assert _propose([[1, 2, 3, 1, 2]], k=5, lo=1, hi=2) == [[3, 1, 2]]
    assert _propose([[7, 7, 7, 7]], k=4, lo=1, hi=3) == [[7]]  # newest earlier [7, 7, 7] ends one before the end


def test_no_match_gives_no_drafts():
    assert _propose([[1, 2, 3, 4, 5], [9], []], k=3, lo=1, hi=3) == [[], [], []]


def test_rows_of_different_lengths():
    seqs = [[1, 2, 3, 1, 2], [4, 5, 4], [6], [8, 9, 8, 9, 8, 9, 1, 8, 9]]
    got = _propose(seqs, k=3, lo=1, hi=4, pad=3)
    assert got == [[3, 1, 2], [5, 4], [], [1, 8, 9]]
    assert got == [reference(s, 3, 1, 4) for s in seqs]


def test_empty_batch():
    drafts, num = NgramProposer(2, 1, 2).propose(np.zeros((0, 4), np.int32), np.zeros(0, np.int32))
    assert drafts.shape == (0, 2) and num.shape == (0,)


@pytest.mark.parametrize("args, name", [
    ((0, 1, 2), "num_speculative_tokens"), ((2, 0, 2), "prompt_lookup_min"), ((2, 1, 0), "prompt_lookup_max"),
    ((2, 3, 2), "prompt_lookup_min"), ((2.0, 1, 2), "num_speculative_tokens"), ((True, 1, 2), "num_speculative"),
])
def test_bad_arguments(args, name):
    with pytest.raises(ValueError, match=name):
        NgramProposer(*args)


def test_bad_inputs():
    p = NgramProposer(2, 1, 2)
    with pytest.raises(ValueError, match="token_ids"):
        p.propose(np.zeros(4, np.int32), np.zeros(1, np.int32))
    with pytest.raises(ValueError, match="num_tokens"):
        p.propose(np.zeros((2, 4), np.int32), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="num_tokens"):
        p.propose(np.zeros((2, 4), np.int32), np.array([1, 5], np.int32))


@settings(max_examples=200, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 3), max_size=24), min_size=1, max_size=6),
    k=st.integers(1, 5), lo=st.integers(1, 4), extra=st.integers(0, 3), pad=st.integers(0, 2),
)
def test_matches_plain_python_reference(seqs, k, lo, extra, pad):
    hi = lo + extra
    assert _propose(seqs, k, lo, hi, pad) == [reference(s, k, lo, hi) for s in seqs]
