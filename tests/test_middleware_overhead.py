"""bench/http/middleware_overhead.py: the container's ASGI middleware against the bare app under a burst of streamed
requests, in-process: every response is served whole through both, the figures are the repetitions' medians, and a
bad count is named."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.http.middleware_overhead", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_both_arms_serve_every_chunk_and_the_figures_are_their_medians(tmp_path):
    out = tmp_path / "overhead.json"
    r = run("--requests", "16", "--chunks", "8", "--reps", "4", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert set(res["seconds"]) == {"bare", "middleware"}
    assert all(len(t) == 4 and min(t) > 0 for t in res["seconds"].values())
    median = {arm: statistics.median(t) * 1e3 for arm, t in res["seconds"].items()}
    assert res["median_ms"] == median
    extra = median["middleware"] - median["bare"]
    assert abs(res["extra_ms_per_burst"] - extra) < 1e-9
    assert abs(res["extra_us_per_chunk"] - extra * 1e3 / (16 * 8)) < 1e-9
    assert f"16 requests x 8 chunks, median of 4 bursts: bare {median['bare']:.2f} ms" in r.stdout


def test_a_count_below_one_is_named():
    r = run("--chunks", "0")
    assert r.returncode == 2 and "--chunks: 1 or more, not 0" in r.stderr
