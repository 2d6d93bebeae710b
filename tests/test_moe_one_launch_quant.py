"""Patch 0006's one-launch FP8 quantization kernel, as the installed (patched) vLLM ships it, run by Triton's
interpreter on the CPU (tests/moe_one_launch_quant_check.py, in its own process) against vLLM's CUDA op's
arithmetic: decode shapes of the TP8 shards in three input dtypes, an all-zero input, the size limit and the
switch. bench/kernels/fp8_quant.py compares the fp8 bits with vLLM's op on the H200."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from check_script import Check
from conftest import check_fixture

ROOT = Path(__file__).resolve().parents[1]


one_launch_quant = check_fixture("one_launch_quant",
                                 lambda tmp: Check("moe_one_launch_quant_check.py", triton_interpret=True))


@pytest.fixture(scope="module")
def cases(one_launch_quant):
    return one_launch_quant["cases"]


def test_scale_and_values_match_vllms_op(cases):
    shaped = {k: v for k, v in cases.items() if isinstance(v, dict) and "q_equal" in v}
    assert len(shaped) == 7 * 3
    bad = {k: v for k, v in shaped.items() if not (v["scale_equal"] and v["q_equal"])}
    assert not bad, bad


def test_block_is_the_smallest_that_holds_the_input(cases):
    assert cases["w2 235B 1 token torch.bfloat16"]["block"] == 2048      # 1,536 elements
    assert cases["w13 235B 1 token torch.bfloat16"]["block"] == 4096
    assert cases["w13 Coder 1 token torch.bfloat16"]["block"] == 8192    # 6,144
    assert cases["w13 235B 2 tokens torch.bfloat16"]["block"] == 8192
    assert cases["w2 235B 4 tokens torch.bfloat16"]["block"] == 8192     # 6,144


def test_all_zero_input_quantizes_as_vllms_op(cases):
    # scale 0, and 0 * (1/0) = NaN, which the CUDA op's fminf turns into fp8_max: dequantized, still 0
    assert cases["all zeros"] == {"scale": 0.0, "q_values": [448.0]}


def test_larger_inputs_are_refused_by_the_kernel(cases):
    assert "8193 elements exceed" in cases["over the limit"]


def test_switch_values(cases):
    assert [cases[f"switch {v!r}"] for v in ("", "1", "on", "0", "off")] == [True, True, True, False, False]
    bad = cases["switch 'maybe'"]
    assert "LMI_FP8_MOE_ONE_LAUNCH_QUANT='maybe'" in bad and "allowed:" in bad


def test_the_shipped_limit_is_where_the_h200_measured_the_kernel_faster():
    """bench/data/h200_engine_6/fp8_quant.json (bench/kernels/fp8_quant.py on the H200): every input the patch serves
    was faster in one launch than through vLLM's op, every larger one slower, and all gave the same fp8 bytes and
    scale. The limit is the patch's largest block size."""
    import re

    patch = (ROOT / "patches" / "0006-fused-moe-one-launch-fp8-quant.patch").read_text()
    blocks = re.search(r"^\+_ONE_LAUNCH_QUANT_BLOCKS = \(([0-9, ]+)\)$", patch, re.M).group(1)
    limit = max(int(b) for b in blocks.split(","))
    recorded = json.loads((ROOT / "bench" / "data" / "h200_engine_6" / "fp8_quant.json").read_text())
    cases = recorded["cases"]
    assert len(cases) == 12 and recorded["all_zero_same"]
    for name, c in cases.items():
        assert c["same_fp8_bytes"] and c["same_scale"], name
        served = c["numel"] <= limit
        assert c["served_by"] == ("one launch" if served else "vLLM's op"), name
        assert (c["ratio_median"] < 1.0) == served, (name, c["ratio_median"])


def test_the_recorded_h200_table_has_every_shape():
    table = [ln for ln in (ROOT / "bench" / "data" / "h200_engine_6" / "fp8_quant.md").read_text().splitlines()
             if ln.startswith("| qwen3")]
    assert len(table) == 12
