import pytest
import torch

from rlvr.core import combine_masks, truncation_mask


def test_truncation_mask_zero_rows():
    m = truncation_mask(torch.tensor([False, True, False]), 4)
    assert m.shape == (3, 4)
    assert m.dtype == torch.get_default_dtype()
    assert torch.equal(m, torch.tensor([[1.0] * 4, [0.0] * 4, [1.0] * 4]))
    assert torch.equal(truncation_mask(torch.tensor([0, 1]), 2), torch.tensor([[1.0, 1.0], [0.0, 0.0]]))


def test_truncation_mask_validation():
    with pytest.raises(ValueError):
        truncation_mask(torch.zeros(2, 2, dtype=torch.bool), 3)
    with pytest.raises(ValueError):
        truncation_mask(torch.zeros(2, dtype=torch.bool), -1)


def test_combine_masks_product_ignores_none():
    M = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    w = torch.tensor([[0.5, 2.0, 3.0], [1.0, 1.0, 1.0]])
    t = truncation_mask(torch.tensor([False, True]), 3)
    out = combine_masks(M, None, w, t)
    assert torch.equal(out, torch.tensor([[0.5, 2.0, 0.0], [0.0, 0.0, 0.0]]))
    assert out.is_floating_point()
    # broadcasting a per-row mask
    row = torch.tensor([[1.0], [0.0]])
    assert torch.equal(combine_masks(w, row), torch.tensor([[0.5, 2.0, 3.0], [0.0, 0.0, 0.0]]))


def test_combine_masks_errors():
    with pytest.raises(ValueError, match="at least one"):
        combine_masks(None, None)
    with pytest.raises(ValueError, match="broadcast"):
        combine_masks(torch.ones(2, 3), torch.ones(3, 2))
