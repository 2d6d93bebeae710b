"""Patch 0009's float32 router logits, as the installed (patched) vLLM builds its GateLinear on a Hopper GPU
(tests/moe_router_fp32_check.py, in its own process): on or unset, an unset out_dtype becomes float32 and with it
vLLM's float32 tiers; a model's own out_dtype and the switch set off stay as stock; an expert method's later
set_out_dtype() applies; a bad value is named. The tiers' kernels run on a GPU only (bench/decode_gemm_bench.py)."""
from __future__ import annotations

import pytest

from check_script import run_check

FP32 = "torch.float32"


@pytest.fixture(scope="module")
def report():
    return run_check("moe_router_fp32_check.py", timeout=300)


def test_on_an_unset_out_dtype_becomes_float32_with_vllms_float32_tiers(report):
    built = report["on"]["built"]
    assert built["out_dtype"] == FP32 and built["cublas_tier"] is True
    assert built["ll_bf16_tier"] is report["ll_bf16_available"]  # cuteDSL: in the GPU image, not on this CPU


def test_an_expert_methods_later_choice_still_applies(report):
    assert report["on"]["after_set_fp32"]["out_dtype"] == FP32
    assert report["on"]["set_again"] == "out_dtype has already been set"  # stock's rule from then on
    later = report["on_with_bf16_set_later"]
    assert later == {"out_dtype": "torch.bfloat16", "cublas_tier": False, "ll_bf16_tier": False}


def test_off_is_stock(report):
    assert report["off"]["built"] == {"out_dtype": "None", "cublas_tier": False, "ll_bf16_tier": False}
    assert report["off"]["after_set_fp32"]["out_dtype"] == FP32


def test_unset_is_on(report):
    assert report["unset"] == report["on"]


def test_a_models_own_out_dtype_is_kept(report):
    assert report["model_fp32"]["built"]["out_dtype"] == FP32
    assert report["model_fp32"]["after_set_fp32"] == "out_dtype has already been set"  # as stock


def test_a_bad_value_is_named(report):
    assert "LMI_MOE_ROUTER_FP32_LOGITS='sometimes' is not understood" in report["bad"]["error"]
