"""Patch 0010, the small-M Triton tier of the block-FP8 dense layers on the CUTLASS path, in the installed (patched)
vLLM. Its kernel runs under Triton's interpreter on the CPU against a float32 reference
(tests/block_fp8_small_m_kernel_check.py); the choice between it and CUTLASS runs as vLLM's patched code with the two
GEMMs (and the input quantization of a fused_input_quant layer) recorded instead of run
(tests/block_fp8_small_m_dispatch_check.py). Its speed is the H200's to show
(bench/decode_gemm_bench.py, the engine bench's image-cutlass-dense arm)."""
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


def test_the_benches_try_the_gemv_dicts_the_patch_accepts():
    """The GEMV dicts bench/dense_gemv_probe.py (its spaces, its shapes) and bench/decode_gemm_bench.py (its grid,
    the shards' dense shapes) time for a shape are those patch 0010's check accepts for it (their shared rule,
    gemv_tiles), so a dict either picks can go into a small-M file as it is."""
    from vllm.model_executor.layers.quantization.utils.fp8_utils import lmi_check_gemv_entry

    from bench import decode_gemm_bench as decode
    from bench import dense_gemv_probe as probe

    cases = [(N, K, g) for N, K in probe.SHAPES.values() for space in probe.SPACES.values() for g in space]
    cases += [(N, K, g) for N, K in decode.shard_shapes()[0].values() for g in decode.GEMV_GRID]
    for N, K, gemv in cases:
        try:
            lmi_check_gemv_entry("probe", gemv, N, K, 128, 128)
            accepted = True
        except ValueError:
            accepted = False
        assert accepted == probe.gemv_tiles(gemv, N, K), (N, K, gemv)


def test_the_dense_probe_reads_each_shapes_weights_from_sets_over_three_times_l2():
    """Each probed shape's weight sets (one byte an FP8 weight) hold over three times L2 together, the kernel
    harness's rotation, within the probe's cap on sets."""
    from bench import dense_gemv_probe as probe
    from bench.moe.problem import L2_BYTES

    for name, (n, k) in probe.SHAPES.items():
        sets = probe.weight_set_count(n, k)
        assert 2 <= sets <= probe.MAX_WEIGHT_SETS and sets * n * k >= 3 * L2_BYTES, name
        assert (sets - 1) * n * k < 3 * L2_BYTES or sets == 2, name  # no more than it takes


GEMV_PROBES = ROOT / "bench" / "data" / "h200_dense_gemv_probe"


def _checked_gemv_entries(path: Path) -> dict[int, dict]:
    """A small-M file's GEMV entries by token count: the file read by patch 0010's parser, and each entry passed by
    its GEMV check for the shape the file's name gives."""
    import re

    from vllm.model_executor.layers.quantization.utils.fp8_utils import (
        LMI_GEMV_KEY,
        lmi_check_gemv_entry,
        lmi_parse_small_m_configs,
    )

    N, K = (int(v) for v in re.match(r"N=(\d+),K=(\d+),", path.name).groups())
    entries = lmi_parse_small_m_configs(str(path), json.loads(path.read_text()), 128)
    gemv = {m: c[LMI_GEMV_KEY] for m, c in entries.items() if c and LMI_GEMV_KEY in c}
    for m, g in gemv.items():
        lmi_check_gemv_entry(f"{path.name} {m}", g, N, K, 128, 128)
    return gemv


def test_the_gemv_candidate_files_are_remade_from_kernel_probe_24b_and_load(tmp_path):
    """The candidate files run 26 gated (bench/data/h200_dense_gemv_probe/candidates): remade byte for byte from
    kernel probe 24b's records over the configs/ they were made from (the 235B's files up to 8 tokens, where the
    shipped ones reach 32), each GEMV entry where the probe's GEMV beat its split-K best, and every file accepted by
    patch 0010's parser and its GEMV check for the file's shape."""
    import shutil

    from bench import dense_gemv_probe as probe
    from bench import small_m_configs

    then = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", then)
    run_17 = json.loads((ROOT / "bench" / "data" / "h200_block_17" / "decode" / "decode_gemm.json").read_text())
    up_to_8 = small_m_configs.from_decode_gemm(run_17, max_tokens=8)
    assert len(small_m_configs.write(up_to_8, then, run_17["triton"], run_17["device"])) == 2
    records = sorted(GEMV_PROBES.glob("probe_24b_*.json"))
    made = probe.candidate_files([json.loads(f.read_text()) for f in records], then, tmp_path / "made")
    recorded = sorted((GEMV_PROBES / "candidates").glob("*.json"))
    assert [p.name for p in made] == [p.name for p in recorded] and len(made) == 3
    for new, old in zip(made, recorded):
        assert new.read_bytes() == old.read_bytes(), old.name
        assert 1 in _checked_gemv_entries(old), old.name


def test_the_235b_candidate_files_are_run_17s_32_token_entries_with_kernel_probe_25s_gemv(tmp_path):
    """bench/data/h200_dense_gemv_probe/candidates_235b, the 235B EP8 rank's files for the next 235B engine bench:
    run 17's small-M files with their 32-token entries (bench/data/h200_block_17/small_m_candidates), the o_proj file
    with kernel probe 25's GEMV entries (`--candidates-from ... --shapes 235b-o-proj`). Remade byte for byte, each
    accepted by patch 0010's parser, and the tier reaching 32 tokens in both."""
    from vllm.model_executor.layers.quantization.utils.fp8_utils import LMI_GEMV_KEY, lmi_parse_small_m_configs

    from bench import dense_gemv_probe as probe

    run_17 = ROOT / "bench" / "data" / "h200_block_17" / "small_m_candidates"
    recorded = GEMV_PROBES / "candidates_235b"
    made = probe.candidate_files([json.loads((GEMV_PROBES / "probe_25.json").read_text())], run_17, tmp_path,
                                 ["235b-o-proj"])
    assert [p.name for p in made] == [p.name for p in run_17.glob("N=4096,K=1024,*.json")]
    qkv = next(run_17.glob("N=1280,K=4096,*.json"))
    assert sorted(p.name for p in recorded.glob("*.json")) == sorted([qkv.name, made[0].name])
    assert (recorded / qkv.name).read_bytes() == qkv.read_bytes()
    assert (recorded / made[0].name).read_bytes() == made[0].read_bytes()
    for path in recorded.glob("*.json"):
        entries = lmi_parse_small_m_configs(str(path), json.loads(path.read_text()), 128)
        assert max(entries) == 32 and entries[32] and LMI_GEMV_KEY not in entries[32], path.name
        gemv = sorted(_checked_gemv_entries(path))
        assert gemv == ([1, 2] if path.name == made[0].name else []), path.name


def test_the_deepseek_o_proj_candidate_is_the_shipped_file_with_kernel_probe_27s_gemv(tmp_path):
    """bench/data/h200_dense_gemv_probe/candidates_deepseek, DeepSeek-V3's o_proj at TP8 attention (N=7168, K=2048)
    for its next engine bench: the shipped file (gated in run 27) with kernel probe 27's GEMV entries at one and two
    tokens, where the GEMV beat the split-K kernel. Remade byte for byte, accepted by patch 0010's parser with each
    GEMV entry passing its check for the shape, and the shipped entries beside them unchanged."""
    from bench import dense_gemv_probe as probe

    recorded = GEMV_PROBES / "candidates_deepseek"
    [made] = probe.candidate_files([json.loads((GEMV_PROBES / "probe_27.json").read_text())], ROOT / "configs",
                                   tmp_path, ["deepseek-v3-o-proj"])
    assert [p.name for p in recorded.glob("*.json")] == [made.name] and made.name.startswith("N=7168,K=2048,")
    old = recorded / made.name
    assert made.read_bytes() == old.read_bytes()
    assert sorted(_checked_gemv_entries(old)) == [1, 2]
    shipped = json.loads((ROOT / "configs" / old.name).read_text())
    assert {k: v for k, v in json.loads(old.read_text()).items() if k not in ("1", "2")} == {
        k: v for k, v in shipped.items() if k != "1"}
