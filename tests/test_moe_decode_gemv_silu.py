"""Patch 0012 (SiLU-and-mul and the w2 input's FP8 group quantization inside the decode GEMV): its kernel under
Triton's interpreter against vLLM's unfused path written out, and the choice inside vLLM's TritonExperts.apply, both
from the installed (patched) vLLM (tests/moe_decode_gemv_silu_check.py)."""
from __future__ import annotations

from check_script import Check
from conftest import check_fixture

UNFUSED = [["gemm", [4, 512, 256]], ["act_and_mul"], ["quant"], ["gemm", [4, 256, 256]], ["moe_sum"]]


decode_gemv_silu = check_fixture("decode_gemv_silu",
                                 lambda tmp: Check("moe_decode_gemv_silu_check.py", triton_interpret=True))


def test_the_fused_kernel_gives_the_unfused_paths_values_in_both_scale_formats(decode_gemv_silu):
    """The same values as SiLU-and-mul, vLLM's group quantization and 0011's GEMV in turn, with and without the
    routed weight and with UE8M0 or float scales; a pair of an expert this rank does not hold gets zeros."""
    k = decode_gemv_silu["kernel"]
    cases = [f"ue8m0={u} mul={m}" for u in (True, False) for m in (True, False)]
    for case in cases:
        assert k[case]["ran"] and k[case]["relerr"] < 1e-6 and k[case]["zeros"], (case, k[case])
    # the scale format reaches the values (power-of-two scales round differently)
    assert k["ue8m0=True mul=True"]["sum"] != k["ue8m0=False mul=True"]["sum"]


def test_operands_it_cannot_take_are_declined_and_a_wrong_gemv_dict_is_named(decode_gemv_silu):
    k = decode_gemv_silu["kernel"]
    assert k["declines a w13 output of the wrong width"] is False
    assert "GEMV={'BLOCK_SIZE_N': 96" in k["bad_config"]


def test_tritonexperts_runs_it_only_for_a_w2_gemv_entry_on_the_naive_assignment_with_the_switches_on(decode_gemv_silu):
    """LMI_MOE_DECODE_GEMV_SILU=1 (off unless set: slower on the H200, run 22)."""
    a = decode_gemv_silu["apply"]
    assert a["default"] == UNFUSED
    # w13, then the fused w2 (the entry's GEMV dict, UE8M0 as vLLM's quantization would use, FP8 max, one pair a
    # program), then vLLM's sum: no act_and_mul, no quantization kernel
    assert a["gemv entry"] == [["gemm", [4, 512, 256]], ["gemv_silu", True, True, 448.0, 1], ["moe_sum"]]
    assert a["expert-map switch"] == a["gemv entry"]
    for case in ("no gemv entry", "two pairs (aligned)", "clamp limit", "switch off", "gemv off"):
        assert a[case] == UNFUSED, case
    assert "LMI_MOE_DECODE_GEMV_SILU='later' is not understood" in a["bad switch"]

