"""bench/block_fp8_split_k.py's split-K block-FP8 GEMM (the candidate kernel probe 16b timed on the H200), run by
Triton's interpreter on the CPU (tests/block_fp8_split_k_check.py, in its own process) against a float32 reference:
every split of the K blocks, uneven and empty shares, rows and columns off the tiles, a bf16 result."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cases():
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "block_fp8_split_k_check.py")],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_split_matches_the_block_scaled_product(cases):
    assert len(cases) == 3 * 4 * 2
    # bf16 results of float32 sums: a relative error of a few 1e-3 at most
    bad = {k: v for k, v in cases.items() if not v["rel_err"] < 1e-2}
    assert not bad, bad


def test_the_result_is_bf16_of_the_full_shape(cases):
    for name, v in cases.items():
        m, n = (int(part[1:]) for part in name.split()[:2])
        assert v["dtype"] == "torch.bfloat16" and v["shape"] == [m, n], name
