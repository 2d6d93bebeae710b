"""bench/e2e_bench.py itself, on the CPU engine: its tiny-cpu check starts both arms, measures them in
turn and writes the figures (the H200 runs use the same code with the FP8 models)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import e2e_bench

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    stock_site = tmp / "stock-site"  # empty: the stock arm runs vLLM's own server on this venv's vLLM
    stock_site.mkdir()
    cmd = [sys.executable, "-m", "bench.e2e_bench", "--stock-site", str(stock_site), "--models-dir",
           str(tmp / "models"), "--out", str(tmp / "out"), "--work", str(tmp / "work"), "--models", "tiny-cpu",
           "--reps", "2", "--waves", "1", "--ready-timeout", "600"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return tmp / "out", p.stdout


def test_both_arms_measured_alternately(run):
    out, stdout = run
    res = json.loads((out / "e2e.json").read_text())
    reps = res["models"]["tiny-cpu"]["reps"]
    assert len(reps["stock"]) == len(reps["image"]) == 2
    for r in reps["stock"] + reps["image"]:
        for c in e2e_bench.THROUGHPUT_CONCURRENCY:
            assert r["throughput"][str(c)]["tokens"] == r["throughput"][str(c)]["requests"] * 128
            assert r["throughput"][str(c)]["tok_s"] > 0
        for c in e2e_bench.LATENCY_CONCURRENCY:
            assert 0 < r["latency"][str(c)]["ttft_p50_ms"] <= r["latency"][str(c)]["ttft_p99_ms"]
    order = [ln.split(" rep ")[1].split(":")[0] for ln in stdout.splitlines() if " rep " in ln]
    assert order == ["0 stock", "0 image", "1 stock", "1 image"]


def test_servers_started_cold_and_stopped(run):
    out, _ = run
    res = json.loads((out / "e2e.json").read_text())
    for name in ("tiny-cpu.stock", "tiny-cpu.image"):
        s = res["servers"][name]
        assert s["failed"] is None and s["ready_s"] > 0 and s["first_ttft_ms"] > 0
        assert s["jit_warnings"] == 0
        assert (out / "logs" / f"{name}.log").stat().st_size > 0
    image_log = (out / "logs" / "tiny-cpu.image.log").read_text()
    assert "setting flashinfer_sampler=False" in image_log  # the image arm is the launcher, not plain vLLM


def test_summary_gives_a_ratio_per_metric(run):
    out, _ = run
    md = (out / "e2e.md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| tiny-cpu | image |")]
    assert len(rows) == len(e2e_bench.THROUGHPUT_CONCURRENCY) + 4 * len(e2e_bench.LATENCY_CONCURRENCY)
    tok1 = next(r for r in rows if "| tok_s | 1 |" in r).split("|")
    assert float(tok1[7]) > 0  # the median image/stock ratio
