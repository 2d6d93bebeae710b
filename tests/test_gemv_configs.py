"""bench/kernels/moe/gemv_configs.py: patch 0011's candidate files from a decode GEMV probe. The recorded candidates are
the ones the recorded probe gives, and each is the shipped file with GEMV dicts added only where the probe measured
the candidate at or below the ratio. configs/ ships the GEMV dicts only where the engine bench gated them."""
from __future__ import annotations

import json
from pathlib import Path

from bench.kernels.moe import gemv_configs
from bench.kernels.moe.shapes import SHAPES
from serving.vllm_patches.moe_configs import config_file_name

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data" / "h200_gemv_probe"


def _strip_gemv(entries: dict) -> dict:
    out = json.loads(json.dumps(entries))
    for e in out.values():
        if isinstance(e, dict):
            for g in ("w13", "w2"):
                if g in e:
                    e[g].pop("GEMV", None)
                    if not e[g]:
                        del e[g]
    return out


def test_the_recorded_candidates_are_the_probes_and_change_only_the_gemv_dicts(tmp_path):
    probe = json.loads((DATA / "gemv_probe_3_wide_m124.json").read_text())
    assert gemv_configs.main(["--from", str(DATA / "gemv_probe_3_wide_m124.json"), "--out", str(tmp_path)]) == 0
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == sorted(p.name for p in (DATA / "candidates").iterdir()) and len(made) == 3
    for name in made:
        entries = json.loads((tmp_path / name).read_text())
        assert entries == json.loads((DATA / "candidates" / name).read_text()), name
        assert _strip_gemv(entries) == _strip_gemv(json.loads((ROOT / "configs" / name).read_text())), name
    # a GEMV dict exactly where the probe's ratio is at most 0.95
    coder = json.loads((tmp_path / "E=20,N=2560,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json")
                        .read_text())
    for row in (r for r in probe["rows"] if r["shape"] == "qwen3-coder-480b-ep8"):
        has = "GEMV" in coder[str(row["M"])].get(row["gemm"], {})
        assert has == (row["ratio"] <= 0.95), row["M"]
        if has:
            assert coder[str(row["M"])][row["gemm"]]["GEMV"] == row["gemv_best"]["cfg"]


# The files whose GEMV dicts the engine bench gated (image-candidates against stock and the image, H200)
GATED = [config_file_name(SHAPES[s]["E"], SHAPES[s]["N"], SHAPES[s]["block"]) for s in gemv_configs.GATED]


def _has_gemv(entries: dict) -> bool:
    return any("GEMV" in e.get(g, {}) for e in entries.values() if isinstance(e, dict) for g in ("w13", "w2"))


def test_configs_ship_gemv_dicts_only_in_the_gated_files_and_exactly_their_candidates():
    shipped = {p.name: json.loads(p.read_text()) for p in sorted((ROOT / "configs").glob("E=*.json"))}
    assert GATED and sorted(n for n, e in shipped.items() if _has_gemv(e)) == sorted(GATED)
    for name in GATED:
        assert shipped[name] == json.loads((DATA / "candidates" / name).read_text()), name
