"""The host-side integer helpers give Triton's results (triton.cdiv, triton.next_power_of_2)."""

import triton
from fold_kernels.ints import cdiv, next_power_of_2

VALUES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 4096, 4097,
          2**31 - 1, 2**31, 2**31 + 1, 2**40 + 3]


def test_cdiv_matches_triton():
    for x in VALUES:
        for y in (1, 2, 3, 7, 16, 64, 128, 1000):
            assert cdiv(x, y) == triton.cdiv(x, y), (x, y)
            assert type(cdiv(x, y)) is int


def test_next_power_of_2_matches_triton():
    for n in VALUES:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
    assert [next_power_of_2(n) for n in (1, 2, 3, 33, 64)] == [1, 2, 4, 64, 64]
