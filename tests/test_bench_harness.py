"""The H200 fused-MoE harness (bench/kernels/moe/) where it runs on the CPU: its command line, and the
files it made reproduced from the raw runs in bench/data/ (configs/ by make_configs), and its report over them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.kernels.moe.cli import build_parser
from bench.kernels.moe.gemv_configs import GATED as GEMV_GATED
from bench.kernels.moe.modes import MODES
from bench.kernels.moe.shapes import TP8_SHAPES, TUNER_MS
from serving.vllm_patches.apply import installed_vllm_dir

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
CONFIGS = ROOT / "configs"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_help_names_every_mode():
    r = run("-m", "bench.kernels.moe", "--help")
    assert r.returncode == 0, r.stderr
    mode_help = " ".join(r.stdout.split("\n  --mode MODE", 1)[1].split("\n  --shapes", 1)[0].split())
    assert [name for name in MODES if f"{name} (" in mode_help] == list(MODES) == [
        "smoke", "jit", "tune", "gtune", "probe", "bench"]


def test_options_are_parsed_into_values():
    o = build_parser().parse_args(["--fused-moe-py", "f.py", "--shapes", "a,,b", "--ms", "1,16,",
                                   "--tune-plan", "x:small;y:3,5", "--jit-ss-ms", "2"])
    assert o.shapes == ["a", "b"] and o.ms == [1, 16] and o.jit_ss_ms == [2]
    assert o.tune_plan == [("x", [m for m in TUNER_MS if m <= 64]), ("y", [3, 5])]
    d = build_parser().parse_args(["--fused-moe-py", "f.py"])
    assert d.ms == TUNER_MS and d.stock_configs_dir is None
    assert d.tune_plan == [(s, [m for m in TUNER_MS if m <= 64]) for s in TP8_SHAPES]


# (tune files, the benches that gated them) of each make_configs command that made configs/:
# the per-tensor TP8 shapes and DeepSeek-V3 TP8 (runs 1-2), the block-FP8 layouts of the official checkpoints
MAKE_CONFIGS_RUNS = (
    (("tune_t3.json", "tune_t4.json", "gtune_g1.json"), ("bench_b5.json",)),
    (("h200_block_10/gtune_gblock.json", "h200_block_10/gtune_gtp4.json"),
     ("h200_block_10/bench_bblock.json", "h200_block_10/bench_btp4.json")),
)


def test_shipped_configs_reproduce_from_the_raw_runs(tmp_path):
    vllm_dir = installed_vllm_dir()
    assert vllm_dir is not None, "vLLM is not installed (make venv): its own configs/ are the stock choice"
    stock = vllm_dir / "model_executor" / "layers" / "fused_moe" / "configs"
    for tune, bench in MAKE_CONFIGS_RUNS:
        r = run("-m", "bench.kernels.moe.make_configs", "--tune", *(str(DATA / t) for t in tune),
                "--bench", *(str(DATA / b) for b in bench), "--stock-configs-dir", str(stock), "--out", str(tmp_path))
        assert r.returncode == 0, r.stderr
    # patch 0011's GEMV dicts, for the shapes the engine gated them on, from the decode GEMV probe
    r = run("-m", "bench.kernels.moe.gemv_configs",
            "--from", str(DATA / "h200_gemv_probe" / "gemv_probe_3_wide_m124.json"),
            "--configs", str(tmp_path), "--out", str(tmp_path), "--shapes", *GEMV_GATED)
    assert r.returncode == 0, r.stderr
    shipped = sorted(p.name for p in CONFIGS.glob("E=*.json"))  # the fused-MoE files (small-M: test_small_m_configs)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == shipped
    for name in shipped:
        assert (tmp_path / name).read_bytes() == (CONFIGS / name).read_bytes(), name


# each kernel report over the raw runs: (bench, jit runs under bench/data/, shapes or None), and how
# many table rows it prints at least
REPORTS = (
    ("bench_b5.json", ("jit_j5q.json", "jit_j5d.json"), None, 100),
    ("h200_block_10/bench_bblock.json", (), "qwen3-235b-ep8,qwen3-coder-480b-ep8,deepseek-v3-ep8,qwen3-coder-480b-tp4",
     60),
    ("h200_block_10/bench_btp4.json", (), None, 15),
)


@pytest.mark.parametrize("bench,jit,shapes,min_rows", REPORTS, ids=["tp8-runs-1-2", "block-run-10", "block-run-10-tp4"])
def test_the_report_tables_the_raw_runs(bench, jit, shapes, min_rows):
    args = ["--bench", str(DATA / bench)] + (["--jit", *(str(DATA / j) for j in jit)] if jit else [])
    r = run("-m", "bench.kernels.moe.report", *args, *(["--shapes", shapes] if shapes else []))
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("|")]
    assert len(rows) > min_rows
