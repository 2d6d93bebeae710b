"""Fused-MoE config files with patch 0011's GEMV dicts, from a recorded decode GEMV probe
(its gemv_probe.json: per shape, token count and GEMM, vLLM's time and the best GEMV config's).

    python -m bench.kernels.moe.gemv_configs --from bench/data/h200_gemv_probe/gemv_probe_3_wide_m124.json \
        --out bench/data/h200_gemv_probe/candidates

For every probed (shape, token count, GEMM) where the candidate's best took at most --max-ratio of vLLM's kernel
with the shipped entry, the shipped file's entry for that token count gets the config under its per-GEMM dict
(`{"w13": {"GEMV": {...}}}`); everything else is the shipped file's. The files are written whole, for the engine
bench's image-candidates arm (laid over configs/). A shape's file ships in configs/ once the engine bench gates it
(GATED); configs/ is then this tool's output for those shapes over bench.kernels.moe.make_configs' files:

    python -m bench.kernels.moe.gemv_configs --from bench/data/h200_gemv_probe/gemv_probe_3_wide_m124.json \
        --configs DIR --out DIR --shapes qwen3-235b-ep8
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from serving.vllm_patches.moe_configs import GEMV_KEY, config_file_name
from .shapes import SHAPES

ROOT = Path(__file__).resolve().parents[3]
# The kernel bench's stock-against-stock spread reached 1.9% (docs/performance.md): a smaller gain is not one
DEFAULT_MAX_RATIO = 0.95
# The shapes whose GEMV dicts ship in configs/, each with the engine run that gated them (docs/performance.md)
GATED = {"qwen3-235b-ep8": "run 20", "qwen3-coder-480b-ep8": "run 21"}


def gemv_files(probe: dict, configs_dir: Path, max_ratio: float = DEFAULT_MAX_RATIO,
               shapes: list[str] | None = None) -> dict[str, dict]:
    """file name -> the shipped file's entries with the GEMV dicts the probe supports (of `shapes`, or every shape)."""
    out: dict[str, dict] = {}
    for row in probe["rows"]:
        best = row.get("gemv_best")
        if not best or row.get("ratio") is None or row["ratio"] > max_ratio:
            continue
        if shapes is not None and row["shape"] not in shapes:
            continue
        shape = SHAPES[row["shape"]]
        name = config_file_name(shape["E"], shape["N"], shape["block"])
        if name not in out:
            path = configs_dir / name
            if not path.is_file():
                raise SystemExit(f"{path}: no shipped file for {row['shape']} (the GEMV dict extends its entries)")
            out[name] = json.loads(path.read_text())
        entry = out[name].get(str(row["M"]))
        if entry is None:
            raise SystemExit(f"{name}: no entry for M={row['M']} to extend")
        entry.setdefault(row["gemm"], {})[GEMV_KEY] = dict(best["cfg"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels.moe.gemv_configs", description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="probe", type=Path, required=True, help="a gemv_probe.json")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--configs", type=Path, default=ROOT / "configs", help="the shipped files extended")
    p.add_argument("--max-ratio", type=float, default=DEFAULT_MAX_RATIO,
                   help="the candidate's time over vLLM's at or below which an entry gets the GEMV dict")
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), help="only these shapes' files (default: all)")
    a = p.parse_args(argv)
    files = gemv_files(json.loads(a.probe.read_text()), a.configs, a.max_ratio, a.shapes)
    a.out.mkdir(parents=True, exist_ok=True)
    for name, entries in sorted(files.items()):
        (a.out / name).write_text(json.dumps(entries, indent=4) + "\n")
        gemv = sorted(f"M={m} {g}" for m, e in entries.items() for g in ("w13", "w2")
                      if isinstance(e, dict) and GEMV_KEY in e.get(g, {}))
        print(f"{a.out / name}: GEMV at {', '.join(gemv)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
