"""The row layouts of broadcast operands (fold_kernels.broadcast): the dense shortcut and the
memoised layouts give what the general merge gives, and broadcast_shape agrees with
torch.broadcast_shapes."""

import pytest
import torch
from fold_kernels import broadcast


def _same(a: broadcast.RowLayout, b: broadcast.RowLayout) -> None:
    assert a.dims == b.dims
    assert [tuple(s) for s in a.strides] == [tuple(s) for s in b.strides]
    for x, y in zip(a.operands, b.operands):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.data_ptr() == y.data_ptr() and x.shape == y.shape


@pytest.mark.parametrize("shape", [(3, 5, 7), (1, 4, 1, 6, 9), (1, 1, 8), (2, 1, 3), (0, 4, 5),
                                   (4, 1), (1, 9), (2, 3, 4, 5, 6, 7)])
@pytest.mark.parametrize("nones", [0, 1])
def test_dense_layout_is_the_general_layout(shape, nones):
    ops = [torch.randn(shape), torch.randn(shape)] + [None] * nones + [torch.randn(shape)]
    dense = broadcast.row_layout(torch.Size(shape), *ops)
    general = broadcast._merge(torch.Size(shape), ops)
    _same(dense, general)


def test_non_dense_operands_take_the_general_layout():
    x = torch.randn(4, 6, 8)
    t = torch.randn(6, 4, 8).transpose(0, 1)  # same shape, not contiguous
    bias = torch.randn(8)
    lay = broadcast.row_layout(x.shape, x, t)
    assert lay.strides[1] != lay.strides[0]
    _same(lay, broadcast._merge(x.shape, [x, t]))
    lay = broadcast.row_layout(x.shape, x, bias)
    assert lay.strides[1][:3] == (0, 0, 0)  # the bias is read in place, broadcast by strides


@pytest.mark.parametrize("shapes", [[(3, 4), (3, 4)], [(2, 1, 5), (7, 5)], [(5,), (2, 3, 5)],
                                    [(1,), (1, 1)], [(4, 1, 2), (4, 1, 2), (3, 1)],
                                    [(2, 3), (3, 2)], [(0, 3), (1, 3)]])
def test_broadcast_shape_matches_torch(shapes):
    try:
        want = tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        want = None
    assert broadcast.broadcast_shape(*shapes) == want


def test_memoised_layout_is_the_merge_for_new_tensors_of_the_same_layout():
    """A second call with other tensors of the same shapes and strides hits the memo; the result
    names the new tensors and the strides of the merge."""
    shape = torch.Size((2, 5, 7, 12))
    mask = torch.randn(2, 1, 7, 12)  # a row-shared dropout mask
    bias = torch.randn(12)
    x = torch.randn(shape)
    first = broadcast.row_layout(shape, x, mask, bias)
    x2, mask2 = torch.randn(shape), torch.randn(2, 1, 7, 12)
    second = broadcast.row_layout(shape, x2, mask2, None)
    third = broadcast.row_layout(shape, x2, mask2, bias)
    _same(first, broadcast._merge(shape, [x, mask, bias]))
    _same(second, broadcast._merge(shape, [x2, mask2, None]))
    _same(third, broadcast._merge(shape, [x2, mask2, bias]))
    assert third.operands[0] is x2 and third.operands[1] is mask2


def test_layout_that_needs_copies_is_not_memoised():
    """Four row dims that no stride order merges: the operands are copied, and the copies (not
    the caller's tensors) are what the kernels must read, on every call."""
    shape = torch.Size((3, 4, 5, 6, 8))
    x = torch.randn(6, 5, 4, 3, 8).permute(3, 2, 1, 0, 4)  # every row dim reversed
    y = torch.randn(shape)
    for _ in range(2):
        lay = broadcast.row_layout(shape, x, y)
        assert lay.operands[0] is not x and lay.operands[0].is_contiguous()
        assert torch.equal(lay.operands[0], x)
        assert lay.dims == (1, 1, 3 * 4 * 5 * 6)
