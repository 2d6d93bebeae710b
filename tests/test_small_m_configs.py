"""bench/small_m_configs.py: the shipped small-M files (patch 0010) are what it makes from kernel probe 16b's rows,
and from a decode GEMM bench it keeps only the cases where the split-K kernel beat CUTLASS in every repetition."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import small_m_configs

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "bench" / "data" / "h200_dense_probe" / "dense_probe.json"


def make(source: Path, out: Path) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "bench.small_m_configs", "--from", str(source), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return sorted(Path(line).name for line in r.stdout.split())


def test_shipped_files_reproduce_from_the_probe(tmp_path):
    made = make(PROBE, tmp_path)
    shipped = sorted(p.name for p in (ROOT / "configs").glob("N=*,small_m.json"))
    assert made == shipped and made
    for name in made:
        assert (tmp_path / name).read_bytes() == (ROOT / "configs" / name).read_bytes(), name


def test_from_a_decode_gemm_bench_only_the_wins_are_kept(tmp_path):
    config = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, SPLIT_K=4, num_warps=4, num_stages=3)

    def case(m, ratio):
        return {"n": 1280, "k": 4096, "m": m, "ratio": {"triton split-K": ratio}, "best_split_k_config": config}

    bench_json = tmp_path / "decode_gemm.json"
    bench_json.write_text(json.dumps({"device": "NVIDIA H200", "triton": "3.7.0", "cases": {
        "dense a qkv M=1": case(1, [0.6, 0.55, 0.65]),
        "dense a qkv M=8": case(8, [0.8, 0.7, 0.99]),
        "dense a qkv M=32": case(32, [0.97, 0.9, 1.02]),  # not faster in every repetition
        "dense a qkv M=64": case(64, [1.3, 1.2, 1.4]),
        "router x M=1": {"n": 16, "k": 4096, "m": 1, "ratio": {}}}}))
    made = make(bench_json, tmp_path / "out")
    assert made == [small_m_configs.file_name(1280, 4096)]
    body = json.loads((tmp_path / "out" / made[0]).read_text())
    assert body == {"triton_version": "3.7.0", "1": config, "8": config}
