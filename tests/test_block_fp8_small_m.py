"""Patch 0010, the small-M Triton tier of the block-FP8 dense layers on the CUTLASS path, in the installed (patched)
vLLM. Its kernel runs under Triton's interpreter on the CPU against a float32 reference
(tests/block_fp8_small_m_kernel_check.py); the choice between it and CUTLASS runs as vLLM's patched code with the two
GEMMs (and the input quantization of a fused_input_quant layer) recorded instead of run
(tests/block_fp8_small_m_dispatch_check.py). Its speed is the H200's to show
(bench/kernels/decode_gemm.py, the engine bench's image-cutlass-dense arm)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from check_script import Check
from conftest import check_fixture

ROOT = Path(__file__).resolve().parents[1]


kernel_cases = check_fixture("kernel_cases",
                             lambda tmp: Check("block_fp8_small_m_kernel_check.py", triton_interpret=True))
dispatch = check_fixture("dispatch", lambda tmp: Check("block_fp8_small_m_dispatch_check.py"))


def test_every_split_and_gemv_matches_the_block_scaled_product(kernel_cases):
    # split-K: 3 shapes x 4 splits x 2 tiles x 3 input layouts; GEMV: the check's four cases
    assert len(kernel_cases) == 3 * 4 * 2 * 3 + 4
    assert sorted(name for name in kernel_cases if " GEMV " in name) == [
        "M1 N256 K640 GEMV BN8 BK128 row", "M3 N320 K640 GEMV BN32 BK128 col-major",
        "M8 N384 K512 GEMV BN32 BK128 col-major", "M8 N384 K512 GEMV BN32 BK512 row"]
    # bf16 results of float32 sums: a relative error of a few 1e-3 at most
    bad = {k: v for k, v in kernel_cases.items() if not v["rel_err"] < 1e-2}
    assert not bad, bad


def test_the_result_is_bf16_of_the_full_shape(kernel_cases):
    for name, v in kernel_cases.items():
        m, n = (int(part[1:]) for part in name.split()[:2])
        assert v["dtype"] == "torch.bfloat16" and v["shape"] == [m, n], name


def test_the_smallest_entry_at_or_above_the_token_count_is_chosen(dispatch):
    assert dispatch["file_name"] == "N=256,K=512,device_name=cpu,dtype=fp8_w8a8,block_shape=[128,128],small_m.json"
    # entries 1, 8, 16 (null: CUTLASS) and 32; nothing above 32
    assert dispatch["by_tokens"] == {"0": None, "1": "1", "2": "8", "8": "8", "9": None, "16": None, "17": "1",
                                     "32": "1", "33": None}
    assert dispatch["no_folder"] is None and dispatch["no_file"] is None


def test_the_op_chooses_per_call_eagerly_and_in_one_compiled_graph(dispatch):
    assert dispatch["eager"] == ["tier SPLIT_K=8 M=1", "tier SPLIT_K=1 M=5", "cutlass M=9", "tier SPLIT_K=8 M=20",
                                 "cutlass M=40"]
    assert dispatch["compiled"] == ["tier SPLIT_K=1 M=3", "tier SPLIT_K=1 M=8", "cutlass M=12",
                                    "tier SPLIT_K=8 M=20", "tier SPLIT_K=1 M=5"]
    assert dispatch["compiled_frames"] == 1
    assert dispatch["built"] == {"fused_input_quant": False}


def test_fused_input_quant_gives_the_tier_the_bf16_input_and_cutlass_a_quantized_one(dispatch):
    assert dispatch["fused_built"] == {"fused_input_quant": True}
    assert dispatch["fused_calls"] == ["tier SPLIT_K=1 M=1 torch.bfloat16 input",
                                       "tier SPLIT_K=1 M=8 torch.bfloat16 input",
                                       "quant M=9 group 128 column-major", "cutlass M=9"]
    assert dispatch["unfused_calls"] == ["tier SPLIT_K=1 M=1"]  # quantized by vLLM's QuantFP8 before the op
    assert "'fused_input_quant' must be true or false" in dispatch["bad_fused_flag"]["error"]


def test_a_gemv_entry_runs_the_matrix_vector_kernel_for_its_token_counts(dispatch):
    """Patch 0010's GEMV entry: chosen by the same rule as a split-K entry, given to the tier (which quantizes a
    fused_input_quant layer's bf16 input itself), CUTLASS where LMI_BLOCK_FP8_DECODE_GEMV=0."""
    assert dispatch["gemv_by_tokens"] == {"1": "gemv", "2": "8", "8": "8", "9": None}
    assert dispatch["gemv_calls"] == ["tier GEMV M=1", "tier SPLIT_K=1 M=5"]
    assert dispatch["fused_gemv_calls"] == ["tier GEMV M=1 torch.bfloat16 input",
                                            "tier SPLIT_K=1 M=8 torch.bfloat16 input"]
    assert dispatch["gemv_off_by_tokens"] == {"1": None, "2": "8"}
    assert "LMI_BLOCK_FP8_DECODE_GEMV='later' is not understood" in dispatch["gemv_bad_switch"]["error"]
    assert dispatch["gemv_bad_switch_beyond"] == "8"


@pytest.mark.parametrize("case", ["switch_off", "batch_invariant"])
def test_switch_off_and_batch_invariant_mode_keep_cutlass(dispatch, case):
    assert dispatch[case] is None
    assert dispatch["switch_off_calls"] == ["cutlass M=1"]


def test_a_bad_switch_fails_the_kernels_build(dispatch):
    for key in ("bad_switch", "bad_switch_build"):
        text = dispatch[key]["error"] if key == "bad_switch" else dispatch[key]
        assert "LMI_BLOCK_FP8_SMALL_M_TRITON='sometimes' is not understood" in text


@pytest.mark.parametrize("case,says", [
    ("unknown_key", "needs null (CUTLASS) or exactly the keys"), ("missing_key", "needs null (CUTLASS) or exactly"),
    ("not_an_object", "needs null (CUTLASS) or exactly the keys"),
    ("block_k", "BLOCK_SIZE_K must be the weight block's K (128); it is 64"),
    ("not_int", "['SPLIT_K'] must be integers >= 1"), ("bad_key", "entry 'one': the key must be a token count"),
    ("empty", "expected a non-empty JSON object"),
    ("gemv_rows", "GEMV BLOCK_SIZE_N=3 must be a power of two dividing 128 and N=256"),
    ("gemv_k", "BLOCK_SIZE_K=1024 a power of two, a multiple of 128, dividing K=512"),
    ("gemv_keys", "a GEMV entry needs exactly the keys"),
    ("gemv_beside", "needs null (CUTLASS) or exactly the keys")])
def test_a_bad_file_is_named_with_its_entry(dispatch, case, says):
    got = dispatch[f"bad_{case}"]
    assert says in got["error"] and got["names_file"], got


SHIPPED = sorted((ROOT / "configs").glob("N=*,K=*,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[[]128,128[]],"
                                        "small_m.json"))


def test_small_m_files_ship():
    assert SHIPPED, "configs/ holds no small-M block-FP8 linear file"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_small_m_file_loads_through_the_patched_parser(path):
    from vllm.model_executor.layers.quantization.utils.fp8_utils import lmi_parse_small_m_configs

    entries = lmi_parse_small_m_configs(str(path), json.loads(path.read_text()), 128)  # raises naming what is wrong
    assert entries[max(entries)] is not None  # a trailing null would only restate CUTLASS above the largest entry


def test_the_decode_gemm_bench_tries_the_gemv_dicts_the_patch_accepts():
    """The GEMV dicts bench/kernels/decode_gemm.py times (its grid, the shards' dense shapes) are those patch 0010's
    check accepts for a shape (gemv_tiles), so a dict it picks can go into a small-M file as it is."""
    from vllm.model_executor.layers.quantization.utils.fp8_utils import lmi_check_gemv_entry

    from bench.kernels import decode_gemm as decode

    cases = [(N, K, g) for N, K in decode.shard_shapes()[0].values() for g in decode.GEMV_GRID]
    for N, K, gemv in cases:
        try:
            lmi_check_gemv_entry("probe", gemv, N, K, 128, 128)
            accepted = True
        except ValueError:
            accepted = False
        assert accepted == decode.gemv_tiles(gemv, N, K), (N, K, gemv)
