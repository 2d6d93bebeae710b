"""bench.e2e.floor on the recorded profile windows of bench/data (every run whose windows carry top_kernels)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.e2e import floor

DATA = Path(__file__).resolve().parents[1] / "bench" / "data"
RUN = DATA / "h200_block_15"
MODEL = "qwen3-235b-ep8-block@94L"


def _load(run: Path) -> dict:
    return json.loads((run / "e2e.json").read_text())


def _windows():
    """(run, model, window) of every recorded window with top_kernels and steps."""
    out = []
    for path in sorted(DATA.glob("*/e2e.json")):
        results = json.loads(path.read_text())
        for model, rec in results.get("models", {}).items():
            for window, p in (rec.get("profile") or {}).items():
                if "top_kernels" in p and "steps" in p:
                    out.append((path.parent.name, model, window))
    return out


WINDOWS = _windows()


def test_the_block_run_has_windows():
    assert ("h200_block_15", MODEL, "image.c1") in WINDOWS
    assert len(WINDOWS) >= 6


@pytest.mark.parametrize("run,model,window", WINDOWS)
def test_rows_sum_to_the_step(run, model, window):
    results = _load(DATA / run)
    d = floor.floor_data(results, model, window, "H200")
    p = results["models"][model]["profile"][window]
    summed = sum(r.us * (d["layers"] if r.scope == "layer" else 1) for r in d["rows"])
    assert summed == pytest.approx(p["total_gpu_ms"] * 1e3 / p["steps"], rel=1e-9)
    assert d["rows"][-1].role == floor.REMAINDER and d["rows"][-1].us >= 0
    assert 0 < d["floor_us"] < d["step_us"]


@pytest.mark.parametrize("run,model,window", WINDOWS)
def test_fused_moe_launches_alternate_w13_w2(run, model, window):
    results = _load(DATA / run)
    d = floor.floor_data(results, model, window, "H200")
    p = results["models"][model]["profile"][window]
    moe = sum(n for name, n, _ in p["top_kernels"] if "fused_moe_kernel" in name)
    per = d["steps"] * d["layers"]
    by_role = {r.role: r for r in d["rows"]}
    w13, w2 = by_role["moe_w13"].launches * per, by_role["moe_w2"].launches * per
    assert w13 + w2 == pytest.approx(moe)
    assert round(w13 - w2) in (0, 1)
    # no MoE launch anywhere else
    assert not any("fused_moe" in k for r in d["rows"] if not r.role.startswith("moe_") for k in r.kernels)


def test_moe_bytes_at_one_token_are_one_expert():
    hidden, inter, block = 4096, 1536, 128  # the qwen3-235b-a22b-ep8 preset

    def fp8_block(n, k):
        return n * k + 4 * (-(-n // block)) * (-(-k // block))

    w13 = 2 * fp8_block(inter, hidden)  # gate_proj and up_proj, each its own tensor
    w2 = fp8_block(hidden, inter)
    d = floor.floor_data(_load(RUN), MODEL, "image.c1", "H200")
    by_role = {r.role: r for r in d["rows"]}
    weights = by_role["moe_w13"].bytes + by_role["moe_w2"].bytes
    activations = hidden * 2 + inter * 2  # one token's w13 input and w2 input, bf16
    assert weights == w13 + w2 + activations


def test_expected_distinct_experts():
    assert floor.expected_experts(16, 1, 32) == pytest.approx(16 * (1 - (15 / 16) ** 32))
    assert floor.expected_experts(16, 1, 1) == pytest.approx(1)
    assert floor.expected_experts(128, 8, 1) == pytest.approx(8)


def test_moe_bytes_grow_with_experts_touched():
    results = _load(RUN)
    one = {r.role: r for r in floor.floor_data(results, MODEL, "image.c1", "H200")["rows"]}
    eight = {r.role: r for r in floor.floor_data(results, MODEL, "image.c8", "H200")["rows"]}
    ratio = floor.expected_experts(16, 1, 8)
    assert eight["moe_w2"].bytes == pytest.approx(one["moe_w2"].bytes * ratio, rel=1e-3)


def test_unknown_window_names_the_windows():
    results = _load(RUN)
    with pytest.raises(ValueError) as e:
        floor.floor_data(results, MODEL, "image.c32", "H200")
    msg = str(e.value)
    assert "image.c32" in msg and "image.c1" in msg and "stock.c8" in msg


def test_window_without_top_kernels_is_refused():
    results = _load(DATA / "h200_engine_3")
    with pytest.raises(ValueError, match="top_kernels"):
        floor.floor_data(results, "qwen3-235b-tp8-tensor", "image.c1", "H200")


def test_roles_by_name_and_launches():
    steps, layers = 64, 94
    assert floor.role_of("nvjet_sm90_tst_64x8_64x16_1x1_h_bz_splitK_TNT", steps * layers, steps) == \
        ("layer", "router GEMM")
    assert floor.role_of("nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT", steps, steps) == \
        ("step", "sampler, logits, lm_head")
    assert floor.role_of("_lmi_block_fp8_mm_small_m", steps * layers, steps)[1] == "qkv_proj + o_proj"
    assert floor.role_of("void vllm::reshape_and_cache_flash_kernel<x>(y)", steps * layers, steps)[1] == "KV write"
    assert floor.short_name("void cutlass::device_kernel<vllm::cutlass_3x_gemm_fp8_blockwise<a, 1>>(x)") == \
        "cutlass_3x_gemm_fp8_blockwise"


def test_table_and_gpu_from_readme():
    assert floor.run_gpu(RUN) == "H200"
    text = floor.floor_table(_load(RUN), MODEL, "image.c1", "H200", context=1000)
    assert "context 1000" in text and "achievable, not nominal" in text and floor.REMAINDER in text
    assert text.count("\n| per ") == len(floor.floor_data(_load(RUN), MODEL, "image.c1", "H200")["rows"])
