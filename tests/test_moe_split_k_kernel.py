"""Patch 0004's split-K fused-MoE kernel, as the installed (patched) vLLM ships
it, run by Triton's interpreter on the CPU (tests/moe_split_k_check.py, in its
own process) against a float32 reference: naive and aligned expert
assignment, per-tensor and [128,128] block scales, swap-AB forced on, both
GEMMs, a second launch of each at M=1; the workspace must be left zeroed. The H200 harness
(bench/moe/) runs the same code on the GPU."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    pytest.importorskip("triton")
    spec = importlib.util.find_spec("vllm.model_executor.layers.fused_moe.fused_moe")
    assert spec is not None, "vLLM is not installed (make venv)"
    if "def fused_moe_kernel_split_k(" not in Path(spec.origin).read_text():
        pytest.fail("the installed vLLM lacks patch 0004 (run `python -m serving.vllm_patches apply`)")
    # Run by path: a package named `tests` in site-packages (smdebug_rulesconfig, through sagemaker-core)
    # would shadow this folder for `python -m tests....`.
    env = dict(os.environ, TRITON_INTERPRET="1", MOE_BENCH_GEN_DIR=str(tmp_path_factory.mktemp("gen")),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "moe_split_k_check.py"), spec.origin],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_case_matches_the_reference(result):
    bad = {k: v for k, v in result["cases"].items() if not v["ok"]}
    assert not bad, bad
    # shapes x M x GEMMs x configs, and each M=1 case launched twice
    assert len(result["cases"]) == 2 * 2 * 2 * 4 + 2 * 2 * 4


def test_split_k_configs_run_the_split_k_kernel_only(result):
    for case, v in result["cases"].items():
        assert v["split_k_kernel"] == (" unsplit " not in case), case


def test_workspace_left_zeroed(result):
    assert result["workspaces"] >= 1 and result["workspace_zeroed"]
