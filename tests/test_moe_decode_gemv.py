"""Patch 0011 (fused-MoE decode batches as matrix-vector products, block FP8): its kernel under Triton's
interpreter against the kernel harness's float32 reference, and the choice inside vLLM's
invoke_fused_moe_triton_kernel, both from the installed (patched) vLLM (tests/moe_decode_gemv_check.py)."""
from __future__ import annotations

from check_script import Check
from conftest import check_fixture


decode_gemv = check_fixture("decode_gemv", lambda tmp: Check("moe_decode_gemv_check.py", triton_interpret=True))


def test_both_gemms_match_the_reference_and_a_pair_of_another_ranks_expert_gets_zeros(decode_gemv):
    cases = {k: v for k, v in decode_gemv["kernel"].items() if k != "bad_config" and not k.startswith("mapped")}
    assert sorted(cases) == ["w13 N128K128", "w13 N2K512", "w13 N8K256", "w2 N128K128", "w2 N8K256"]
    for case, r in cases.items():
        assert r["ran"] and r["relerr"] < 1e-5 and r["non_local_zeros"], (case, r)


def test_an_ep_ranks_batch_with_mapped_ids_matches_the_reference_and_zeros_the_other_ranks_pairs(decode_gemv):
    """A decode batch of a rank of a real EP deployment (3 tokens, the global top-4, another rank's
    expert -1) through 0011's launcher, a program per pair and a program per token (its 4 pairs in turn): every
    pair of this rank's experts right, every other pair zeros."""
    for per_program, programs in ((1, 12), (4, 3)):
        for gemm in ("w13", "w2"):
            r = decode_gemv["kernel"][f"mapped {gemm}, {per_program} pairs a program"]
            assert r["ran"] and r["pairs"] == 12 and 0 < r["local"] < 12, r
            assert r["grid"][0][0] == programs and r["grid"][1] == per_program, r
            assert r["relerr"] < 1e-5 and r["remote_zeros"], r


def test_a_wrong_gemv_dict_is_refused_naming_it(decode_gemv):
    assert "GEMV={'BLOCK_SIZE_N': 96" in decode_gemv["kernel"]["bad_config"]
    assert "must be a power of two dividing 128" in decode_gemv["kernel"]["bad_config"]


def test_the_gemv_runs_only_for_its_key_on_the_naive_assignment_with_the_switch_on(decode_gemv):
    d = decode_gemv["dispatch"]
    assert d["naive"] == ["gemv", True, 1]
    # with the expert-map switch a program takes one token's routed pairs (the routing's top-2 here)
    assert d["naive, expert-map switch"] == ["gemv", True, 2]
    # elsewhere fused_moe_kernel runs, and never sees the key
    assert d["aligned"] == d["no key"] == d["switch off"] == ["fused_moe_kernel", False]
    assert "LMI_MOE_DECODE_GEMV='sometimes' is not understood" in d["bad switch"]


def test_under_an_expert_map_the_mapped_ids_take_the_naive_assignment_only_when_asked(decode_gemv):
    """LMI_MOE_DECODE_GEMV_EXPERT_MAP=1: a few routed pairs whose w13 entry holds a GEMV dict get their ids mapped to
    this rank's experts (another rank's expert and an invalid id: -1) and no alignment; unset (the default), without
    the key, with too many pairs or with the GEMV off, vLLM aligns them."""
    e = decode_gemv["dispatch"]["expert map"]
    assert e["on"] == {"sorted": None, "ids": [0, -1, 3, -1], "dtype": "torch.int32", "padded": [4 * 16]}
    assert e["default"] == e["on, no key"] == e["on, many pairs"] == e["on, GEMV off"] == "aligned"
    assert "LMI_MOE_DECODE_GEMV_EXPERT_MAP='maybe' is not understood" in e["bad"]


def test_the_candidate_files_give_the_gemv_where_the_probe_measured_a_gain(decode_gemv):
    """bench/data/h200_gemv_probe/candidates, read by vLLM's patched lookup for the Qwen3-Coder EP8 rank: both GEMMs
    at one token, w13 at two and four (its w2 was 0.965x and 1.061x there), none at eight (not probed)."""
    assert decode_gemv["file"] == {"1": ["w13", "w2"], "2": ["w13"], "4": ["w13"], "8": []}
