"""Patch 0004's split-K fused-MoE kernel, as the installed (patched) vLLM ships
it, run by Triton's interpreter on the CPU (tests/moe_split_k_check.py, in its
own process) against a float32 reference: naive and aligned expert
assignment, per-tensor and [128,128] block scales, swap-AB forced on, both
GEMMs, a second launch of each at M=1; the workspace must be left zeroed. The H200 harness
(bench/kernels/moe/) runs the same code on the GPU."""
from __future__ import annotations

import pytest

from check_script import Check, vllm_file
from conftest import check_fixture

FUSED_MOE = "model_executor/layers/fused_moe/fused_moe.py"


def _shape_check(shape: str):
    """The check of one scale format (the script's SHAPES), so the two run side by side."""
    return lambda tmp: Check("moe_split_k_check.py", args=(str(vllm_file(FUSED_MOE)), shape), triton_interpret=True,
                             env={"MOE_BENCH_GEN_DIR": str(tmp)})


split_k_per_tensor = check_fixture("split_k_per_tensor", _shape_check("per-tensor"))
split_k_block = check_fixture("split_k_block", _shape_check("block-128"))


@pytest.fixture(scope="module")
def result(split_k_per_tensor, split_k_block):
    if "def fused_moe_kernel_split_k(" not in vllm_file(FUSED_MOE).read_text():
        pytest.fail("the installed vLLM lacks patch 0004 (run `python -m serving.vllm_patches apply`)")
    parts = (split_k_per_tensor, split_k_block)
    return {"cases": {k: v for part in parts for k, v in part["cases"].items()},
            "workspace_zeroed": all(part["workspace_zeroed"] for part in parts),
            "workspaces": min(part["workspaces"] for part in parts)}


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
