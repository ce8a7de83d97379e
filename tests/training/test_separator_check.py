"""The separator rule of training/contract/separator_check.py, on whole documents and on pieces."""

import numpy as np
import pytest

from training.contract.separator_check import misplaced_separators, separator_mask

SEP = 0


def test_whole_documents():
    lengths = np.array([3, 1, 2])
    assert separator_mask(lengths, "after").tolist() == [0, 0, 1, 1, 0, 1]
    assert separator_mask(lengths, "before").tolist() == [1, 0, 0, 1, 1, 0]
    good = np.array([5, 6, SEP, SEP, 7, SEP])
    assert misplaced_separators(good, SEP, "after", lengths).tolist() == []
    doubled, missing = good.copy(), good.copy()
    doubled[0], missing[5] = SEP, 9
    assert misplaced_separators(doubled, SEP, "after", lengths).tolist() == [0]
    assert misplaced_separators(missing, SEP, "after", lengths).tolist() == [5]
    assert misplaced_separators(good, SEP, "before", lengths).tolist() == [0, 2, 4, 5]


def test_pieces_cut_documents_anywhere():
    # tokens 1..2 of a 4-token document (no end, no start), then tokens 2..3 (its end), then the
    # first token of a 5-token document
    lengths, starts, counts = np.array([4, 4, 5]), np.array([1, 2, 0]), np.array([2, 2, 1])
    assert separator_mask(lengths, "after", starts, counts).tolist() == [0, 0, 0, 1, 0]
    assert separator_mask(lengths, "before", starts, counts).tolist() == [0, 0, 0, 0, 1]
    tokens = np.array([5, 6, 7, SEP, 8], np.uint16)
    assert misplaced_separators(tokens, SEP, "after", lengths, starts, counts).tolist() == []


def test_an_empty_document_has_no_place_and_an_unknown_position_is_refused():
    assert separator_mask(np.array([0, 2, 0]), "after").tolist() == [0, 1]
    assert separator_mask(np.array([0, 2, 0]), "before").tolist() == [1, 0]
    with pytest.raises(ValueError, match="neither 'after' nor 'before'"):
        separator_mask(np.array([2]), "middle")
