"""Patch 0009's float32 router logits, as the installed (patched) vLLM builds its GateLinear on a Hopper GPU
(tests/moe_router_fp32_check.py, in its own process): on or unset, an unset out_dtype becomes float32 and with it
vLLM's float32 tiers; a model's own out_dtype and the switch set off stay as stock; an expert method's later
set_out_dtype() applies; a bad value is named. The tiers' kernels run on a GPU only (bench/kernels/decode_gemm.py)."""
from __future__ import annotations

from check_script import Check
from conftest import check_fixture

FP32 = "torch.float32"


router_fp32 = check_fixture("router_fp32", lambda tmp: Check("moe_router_fp32_check.py"))


def test_on_an_unset_out_dtype_becomes_float32_with_vllms_float32_tiers(router_fp32):
    built = router_fp32["on"]["built"]
    assert built["out_dtype"] == FP32 and built["cublas_tier"] is True
    assert built["ll_bf16_tier"] is router_fp32["ll_bf16_available"]  # cuteDSL: in the GPU image, not on this CPU


def test_an_expert_methods_later_choice_still_applies(router_fp32):
    assert router_fp32["on"]["after_set_fp32"]["out_dtype"] == FP32
    assert router_fp32["on"]["set_again"] == "out_dtype has already been set"  # stock's rule from then on
    later = router_fp32["on_with_bf16_set_later"]
    assert later == {"out_dtype": "torch.bfloat16", "cublas_tier": False, "ll_bf16_tier": False}


def test_off_is_stock(router_fp32):
    assert router_fp32["off"]["built"] == {"out_dtype": "None", "cublas_tier": False, "ll_bf16_tier": False}
    assert router_fp32["off"]["after_set_fp32"]["out_dtype"] == FP32


def test_unset_is_on(router_fp32):
    assert router_fp32["unset"] == router_fp32["on"]


def test_a_models_own_out_dtype_is_kept(router_fp32):
    assert router_fp32["model_fp32"]["built"]["out_dtype"] == FP32
    assert router_fp32["model_fp32"]["after_set_fp32"] == "out_dtype has already been set"  # as stock


def test_a_bad_value_is_named(router_fp32):
    assert "LMI_MOE_ROUTER_FP32_LOGITS='sometimes' is not understood" in router_fp32["bad"]["error"]
