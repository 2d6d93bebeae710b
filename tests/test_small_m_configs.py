"""bench/kernels/small_m_configs.py: the shipped small-M files (patch 0010) are what it makes from the decode GEMM
benches of runs 17 (the 235B EP8 rank's shapes) and 18 (the Coder EP8 rank's, and DeepSeek-V3's attention GEMMs),
with the counts the engine bench gated: the 235B's up to 32 tokens (runs 17 and 31), the Coder's up to 8 (run 23)
with its one-token GEMV entries from kernel probe 24b (--gemv-from, gated in run 26), and DeepSeek-V3's o_proj at TP8
attention as run 18's lease wrote it (gated in run 27; the shard's qkv stands in for MLA, so its file does not ship);
the H100's own files for the 235B's shapes, the H200's entries with run 42's at 48-128 tokens over them (its lease's
decode GEMM bench on an H100, `--base` the H200 files, gated in the same run); and it gives the split-K kernel only
the token counts where it beat CUTLASS in every repetition."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.kernels import small_m_configs

ROOT = Path(__file__).resolve().parents[1]
RUN_17 = ROOT / "bench" / "data" / "h200_block_17" / "decode" / "decode_gemm.json"
RUN_18 = ROOT / "bench" / "data" / "h200_block_18"
RUN_42 = ROOT / "bench" / "data" / "h100_block_42"
H100 = "NVIDIA_H100_80GB_HBM3"


def h200_files(folder: Path) -> Path:
    """`folder` holding configs/' H200 small-M files alone (configs/ before the H100 had files of its own)."""
    folder.mkdir()
    for f in (ROOT / "configs").glob("*device_name=NVIDIA_H200,*small_m.json"):
        (folder / f.name).write_bytes(f.read_bytes())
    return folder


def make(source: Path, out: Path, *args: str) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "bench.kernels.small_m_configs", "--from", str(source),
                        "--out", str(out), *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return sorted(Path(line).name for line in r.stdout.split())


# configs/' small-M files: the decode GEMM bench each came from, its flags, the shapes taken from it, the dense GEMV
# probe's shapes whose GEMV entries were then laid over them (--gemv-from), and the
# GPU the bench ran on (the files' device). BASE: `--base`, the H200's files as configs/ held them before run 42.
GEMV_PROBES = sorted((ROOT / "bench" / "data" / "h200_dense_gemv_probe").glob("probe_24b_*.json"))
BASE = "{base}"
SHIPPED = ((RUN_17, (), ((1280, 4096), (4096, 1024)), (), "NVIDIA_H200"),
           (RUN_18 / "decode" / "decode_gemm.json", ("--max-tokens", "8", "--fused-input-quant", "6144x12288"),
            ((14336, 6144), (6144, 12288)), ("coder-qkv", "coder-o-proj"), "NVIDIA_H200"),
           (RUN_18 / "decode" / "decode_gemm.json", ("--fused-input-quant", "7168x2048"), ((7168, 2048),), (),
            "NVIDIA_H200"),
           (RUN_42 / "decode" / "decode_gemm.json", ("--base", BASE), ((1280, 4096), (4096, 1024)), (), H100))


def test_shipped_files_reproduce_from_runs_17_18_and_42_and_kernel_probe_24b(tmp_path):
    base = h200_files(tmp_path / "base")
    expected = []
    for i, (source, flags, shapes, gemv_shapes, device) in enumerate(SHIPPED):
        made = make(source, tmp_path / str(i), *(str(base) if f == BASE else f for f in flags))
        if gemv_shapes:
            folder = str(tmp_path / str(i))
            r = subprocess.run([sys.executable, "-m", "bench.kernels.small_m_configs",
                                "--gemv-from", *map(str, GEMV_PROBES), "--gemv-shapes", *gemv_shapes, "--base", folder, "--out", folder],
                               cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            assert len(r.stdout.split()) == len(gemv_shapes)
        for n, k in shapes:
            name = small_m_configs.file_name(n, k, device)
            assert name in made, (source, name)
            assert (tmp_path / str(i) / name).read_bytes() == (ROOT / "configs" / name).read_bytes(), name
            expected.append(name)
    assert sorted(p.name for p in (ROOT / "configs").glob("N=*,small_m.json")) == sorted(expected)


def test_run_18s_candidate_files_are_what_its_lease_made_from_its_decode_bench(tmp_path):
    """bench/e2e/runbook.sh SMALL_M_CANDIDATES wrote them on the H200 from the same decode_gemm.json."""
    made = make(RUN_18 / "decode" / "decode_gemm.json", tmp_path,
                "--fused-input-quant", "6144x12288", "4096x1024", "7168x2048")
    recorded = sorted(p.name for p in (RUN_18 / "small_m_candidates").glob("*.json"))
    assert made == recorded and len(made) == 6
    for name in made:
        assert (tmp_path / name).read_bytes() == (RUN_18 / "small_m_candidates" / name).read_bytes(), name
    coder_o_proj = json.loads((tmp_path / small_m_configs.file_name(6144, 12288)).read_text())
    assert coder_o_proj["fused_input_quant"] is True and coder_o_proj["1"] is None and coder_o_proj["8"]


def test_the_h100s_235b_files_are_run_42s_candidates_the_h200s_entries_below_48_tokens():
    """What run 42's lease wrote on the H100 (SMALL_M_CANDIDATES="--base configs") ships as it ran in the engine: below
    48 tokens the H200's entries, which the H100 read before as the same chip's, and from 48 to 128 tokens the split-K
    kernel's 64-row tiles, each faster than CUTLASS in every repetition of that bench."""
    bench = json.loads((RUN_42 / "decode" / "decode_gemm.json").read_text())
    assert bench["device"] == "NVIDIA H100 80GB HBM3"
    for n, k in ((1280, 4096), (4096, 1024)):
        name = small_m_configs.file_name(n, k, H100)
        shipped = json.loads((ROOT / "configs" / name).read_text())
        assert (RUN_42 / "candidates" / name).read_bytes() == (ROOT / "configs" / name).read_bytes(), name
        h200 = json.loads((ROOT / "configs" / small_m_configs.file_name(n, k)).read_text())
        assert {m: shipped[m] for m in ("1", "8", "32")} == {m: h200.get(m) for m in ("1", "8", "32")}, name
        for m in (48, 64, 96, 128):
            assert shipped[str(m)]["BLOCK_SIZE_M"] == 64, (name, m)
            case = next(c for name, c in bench["cases"].items()
                        if name.startswith("dense ") and (c["n"], c["k"], c["m"]) == (n, k, m))
            assert max(case["ratio"]["triton split-K"]) < 1.0, (name, m)


def test_from_a_decode_gemm_bench_only_the_wins_are_kept(tmp_path):
    config = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, SPLIT_K=4, num_warps=4, num_stages=3)

    def case(m, ratio):
        return {"n": 1280, "k": 4096, "m": m, "ratio": {"triton split-K": ratio}, "best_split_k_config": config}

    bench_json = tmp_path / "decode_gemm.json"
    bench_json.write_text(json.dumps({"device": "NVIDIA H200", "triton": "3.7.0", "cases": {
        "dense a qkv M=1": case(1, [1.1, 1.05, 1.15]),  # CUTLASS is faster: null
        "dense a qkv M=8": case(8, [0.8, 0.7, 0.99]),
        "dense a qkv M=16": case(16, [0.97, 0.9, 1.02]),  # not faster in every repetition
        "dense a qkv M=32": case(32, [0.6, 0.55, 0.65]),
        "dense a qkv M=64": case(64, [1.3, 1.2, 1.4]),  # trailing: left out
        "dense b o_proj M=1": dict(case(1, [1.2, 1.1, 1.3]), n=4096, k=1024),  # never won: no file
        "router x M=1": {"n": 16, "k": 4096, "m": 1, "ratio": {}}}}))
    made = make(bench_json, tmp_path / "out")
    assert made == [small_m_configs.file_name(1280, 4096)]
    body = json.loads((tmp_path / "out" / made[0]).read_text())
    assert body == {"triton_version": "3.7.0", "1": None, "8": config, "16": None, "32": config}
    assert list(body) == ["triton_version", "1", "8", "16", "32"]
    made = make(bench_json, tmp_path / "upto8", "--max-tokens", "8")
    assert json.loads((tmp_path / "upto8" / made[0]).read_text()) == {"triton_version": "3.7.0", "1": None, "8": config}


def test_a_fused_input_quant_shape_is_judged_against_quantization_plus_cutlass(tmp_path):
    config = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=128, SPLIT_K=1, num_warps=4, num_stages=3)

    def case(m, plain, fused):
        return {"n": 4096, "k": 1024, "m": m, "best_split_k_config": config,
                "ratio": {"triton split-K": plain, small_m_configs.FUSED_RATIO: fused}}

    bench_json = tmp_path / "decode_gemm.json"
    bench_json.write_text(json.dumps({"device": "NVIDIA H200", "triton": "3.7.1", "cases": {
        "dense o M=1": case(1, [1.1, 1.05, 1.15], [0.8, 0.75, 0.9]),  # loses on fp8 input, wins quantizing it
        "dense o M=8": case(8, [0.7, 0.6, 0.8], [1.02, 0.98, 1.05])}}))  # the opposite: CUTLASS
    made = make(bench_json, tmp_path / "out", "--fused-input-quant", "4096x1024")
    assert json.loads((tmp_path / "out" / made[0]).read_text()) == {
        "triton_version": "3.7.1", "fused_input_quant": True, "1": config}
    plain = make(bench_json, tmp_path / "plain")
    assert json.loads((tmp_path / "plain" / plain[0]).read_text()) == {"triton_version": "3.7.1", "1": None,
                                                                        "8": config}


def test_a_bench_of_larger_token_counts_adds_to_the_shipped_entries_with_base(tmp_path):
    """--base configs: a bench of 64 and 128 tokens on an H100 keeps the shipped (H200) file's entries at 1-32 tokens,
    a GEMV entry and fused_input_quant included, and writes the H100's own file; a shape where the split-K kernel
    never won gets no file (the shipped one serves as it is); a base folder that does not exist is named."""
    tall = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, SPLIT_K=2, num_warps=8, num_stages=3)

    def case(n, k, m, ratio):
        return {"n": n, "k": k, "m": m, "best_split_k_config": dict(tall, GROUP_SIZE_M=1),
                "ratio": {"triton split-K": ratio, small_m_configs.FUSED_RATIO: ratio}}

    bench_json = tmp_path / "decode_gemm.json"
    bench_json.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "triton": "3.7.1", "cases": {
        "dense qkv M=64": case(1280, 4096, 64, [0.7, 0.65, 0.8]),
        "dense qkv M=128": case(1280, 4096, 128, [1.1, 1.05, 1.2]),  # CUTLASS: trailing, left out
        "dense o_proj M=64": case(4096, 1024, 64, [1.1, 1.05, 1.2]),  # never won: no file
        "dense coder o_proj M=64": case(6144, 12288, 64, [0.9, 0.85, 0.95])}}))
    configs = h200_files(tmp_path / "h200")  # the H100 has none of its own there
    made = make(bench_json, tmp_path / "out", "--base", str(configs))
    device = "NVIDIA H100 80GB HBM3"
    assert made == sorted(small_m_configs.file_name(n, k, device) for n, k in ((1280, 4096), (6144, 12288)))
    for n, k in ((1280, 4096), (6144, 12288)):
        shipped = json.loads((configs / small_m_configs.file_name(n, k)).read_text())
        body = json.loads((tmp_path / "out" / small_m_configs.file_name(n, k, device)).read_text())
        assert body == {**shipped, "64": tall}, (n, k)
        assert [int(m) for m in body if m.isdigit()] == sorted(int(m) for m in body if m.isdigit())
    assert "GEMV" in body["1"] and body["fused_input_quant"] is True  # the Coder's o_proj as shipped, plus 64 tokens
    # where the base holds the device's own file (configs/ the H100's 235B files), that file is the base
    own = small_m_configs.file_name(1280, 4096, device)
    make(bench_json, tmp_path / "own", "--base", str(ROOT / "configs"))
    shipped = json.loads((ROOT / "configs" / own).read_text())
    assert json.loads((tmp_path / "own" / own).read_text()) == {**shipped, "64": tall}
    r = subprocess.run([sys.executable, "-m", "bench.kernels.small_m_configs", "--from", str(bench_json), "--out",
                        str(tmp_path / "none"), "--base", str(tmp_path / "missing")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"--base {tmp_path / 'missing'}: no such folder" in r.stderr
    assert not (tmp_path / "none").exists()
