"""bench/moe/gemv_kernel.py, the decode fused-MoE kernel the H200 probe (bench/moe_gemv_probe.py) times against
vLLM's: run by Triton's interpreter on the CPU (tests/moe_gemv_kernel_check.py, in its own process) against the
kernel harness's float32 reference of both GEMMs, block scales per 128-group, w2 with the routed weights."""
from __future__ import annotations

from check_script import run_check


def test_both_gemms_match_the_reference_and_a_tile_across_scale_blocks_is_refused():
    r = run_check("moe_gemv_kernel_check.py", triton_interpret=True)
    assert len(r["cases"]) == 14, sorted(r["cases"])  # the ep-like w2 (K=128) has no 256-wide K step
    bad = {k: v for k, v in r["cases"].items() if not v < 1e-5}
    assert not bad, bad
    assert r["refused"] and "BLOCK_SIZE_N 96 must divide 128" in r["refused"]
