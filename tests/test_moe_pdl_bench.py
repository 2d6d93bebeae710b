"""bench/moe_pdl_bench.py (programmatic dependent launch for fused_moe_kernel, tried and not shipped) without a GPU:
the entries it times, and its refusal to run where there is no CUDA device."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.moe_pdl_bench import entry_without_split_k

ROOT = Path(__file__).resolve().parent.parent


def test_the_timed_entry_is_the_shipped_one_without_split_k():
    entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "SPLIT_K": 2, "w13": {"SPLIT_K": 8, "num_stages": 6},
             "w2": {"BLOCK_SIZE_N": 16}}
    assert entry_without_split_k(entry) == {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "w13": {"num_stages": 6},
                                            "w2": {"BLOCK_SIZE_N": 16}}
    assert entry["w13"]["SPLIT_K"] == 8  # the shipped entry itself is left as it is


def test_without_a_cuda_device_it_refuses_and_says_why(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "moe_pdl_bench.py"), "--fused-moe-py", "x.py",
                        "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "no CUDA device here" in r.stderr
    assert not any(tmp_path.iterdir())
