"""`make smoke` must never pass silently: with SMOKE_REQUIRE_GPU=1 and no usable GPU, the GPU smoke
tests fail and name what is missing; without it they are skipped (a suite that was not asked for)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# every test of the smoke suite
SMOKE_TESTS = len(re.findall(r"^def test_", (ROOT / "tests" / "test_gpu_smoke.py").read_text(), re.M))


def _run_smoke(require: str | None, basetemp: Path) -> subprocess.CompletedProcess:
    """The GPU smoke suite in a child pytest, in a temporary folder of its own (basetemp). A child given none makes a
    numbered folder beside this session's and deletes the oldest of those: earlier sessions' engine folders of a GiB
    or more, and, after three children, this session's own."""
    env = {k: v for k, v in os.environ.items() if k != "SMOKE_REQUIRE_GPU"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, also on a machine that has one
    if require is not None:
        env["SMOKE_REQUIRE_GPU"] = require
    return subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-rs",
                           f"--basetemp={basetemp}", "tests/test_gpu_smoke.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_required_gpu_run_fails_and_names_what_is_missing(tmp_path):
    r = _run_smoke("1", tmp_path / "child")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "SMOKE_REQUIRE_GPU=1 but the GPU stack is not usable" in out, out[-3000:]
    assert "sees no CUDA GPU" in out or "import torch failed" in out, out[-3000:]
    assert f"{SMOKE_TESTS} error" in out, out[-3000:]  # every smoke test, none skipped


def test_unrequested_gpu_suite_skips_without_gpu(tmp_path):
    r = _run_smoke(None, tmp_path / "child")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert f"{SMOKE_TESTS} skipped" in out and "sees no CUDA GPU" in out, out[-3000:]
