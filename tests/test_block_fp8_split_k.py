"""bench/block_fp8_split_k.py's split-K block-FP8 GEMM (the candidate kernel probe 16b timed on the H200), run by
Triton's interpreter on the CPU (tests/block_fp8_split_k_check.py, in its own process) against a float32 reference:
every split of the K blocks, uneven and empty shares, rows and columns off the tiles, a bf16 result."""
from __future__ import annotations

import pytest

from check_script import run_check


@pytest.fixture(scope="module")
def cases():
    return run_check("block_fp8_split_k_check.py", triton_interpret=True)


def test_every_split_matches_the_block_scaled_product(cases):
    assert len(cases) == 3 * 4 * 2
    # bf16 results of float32 sums: a relative error of a few 1e-3 at most
    bad = {k: v for k, v in cases.items() if not v["rel_err"] < 1e-2}
    assert not bad, bad


def test_the_result_is_bf16_of_the_full_shape(cases):
    for name, v in cases.items():
        m, n = (int(part[1:]) for part in name.split()[:2])
        assert v["dtype"] == "torch.bfloat16" and v["shape"] == [m, n], name
