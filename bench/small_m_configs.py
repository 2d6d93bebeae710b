"""Patch 0010's small-M files (configs/N=<N>,K=<K>,...,small_m.json) from H200 timings of the split-K block-FP8 GEMM.

    python -m bench.small_m_configs --from bench/data/h200_dense_probe/dense_probe.json --out configs
    python -m bench.small_m_configs --from OUT/decode/decode_gemm.json --out DIR

- A kernel probe's rows (bench/data/h200_dense_probe/dense_probe.py: the Triton kernel alone, 16-row tiles, 4 warps):
  per shape and token count, the fastest row whose error is under 2%. The probe did not time CUTLASS; run 15's
  profile of the same shapes (7.2 us a GEMM at one token, 11.2 at eight) is above every entry it gives.
- bench/decode_gemm_bench.py's cases, where CUTLASS ran beside the kernel in the image's stack: per shape and token
  count, the best split-K config where it was faster than CUTLASS in every paired repetition, and nothing where not.

An entry serves every token count from the entry below it (exclusive) up to its own (patch 0010's rule), so a token
count without an entry is served by the next larger one. Writes one file per shape; prints what it wrote.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

BLOCK = 128
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "SPLIT_K", "num_warps", "num_stages")
MAX_PROBE_ERROR = 0.02


def file_name(n: int, k: int, device: str = "NVIDIA_H200") -> str:
    # patch 0010's lmi_small_m_config_file_name; vLLM names the device by get_device_name_as_file_name()
    return f"N={n},K={k},device_name={device.replace(' ', '_')},dtype=fp8_w8a8,block_shape=[{BLOCK},{BLOCK}],small_m.json"


def from_probe(data: dict) -> dict[tuple[int, int], dict[int, dict]]:
    best: dict[tuple[int, int, int], dict] = {}
    for r in data["rows"]:
        if "us" not in r or not r["rel_err"] < MAX_PROBE_ERROR:
            continue
        key = (r["N"], r["K"], r["M"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    shapes: dict[tuple[int, int], dict[int, dict]] = {}
    for (n, k, m), r in sorted(best.items()):
        shapes.setdefault((n, k), {})[m] = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=r["BLOCK_N"], BLOCK_SIZE_K=BLOCK,
                                                SPLIT_K=r["SPLIT_K"], num_warps=4, num_stages=r["num_stages"])
    return shapes


def from_decode_gemm(data: dict) -> dict[tuple[int, int], dict[int, dict]]:
    shapes: dict[tuple[int, int], dict[int, dict]] = {}
    for name, case in sorted(data["cases"].items(), key=lambda kv: (kv[1].get("n", 0), kv[1].get("k", 0),
                                                                     kv[1].get("m", 0))):
        ratio = case.get("ratio", {}).get("triton split-K")
        if not name.startswith("dense ") or not ratio or not case.get("best_split_k_config"):
            continue
        if ratio[2] < 1.0:  # faster than CUTLASS in every paired repetition
            shapes.setdefault((case["n"], case["k"]), {})[case["m"]] = case["best_split_k_config"]
    return shapes


def write(shapes: dict[tuple[int, int], dict[int, dict]], out: Path, triton_version: str | None,
          device: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for (n, k), entries in sorted(shapes.items()):
        body: dict[str, object] = {"triton_version": triton_version} if triton_version else {}
        body.update({str(m): {key: entries[m][key] for key in KEYS} for m in sorted(entries)})
        path = out / file_name(n, k, device)
        path.write_text(json.dumps(body, indent=4) + "\n")
        written.append(path)
    return written


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="source", type=Path, required=True,
                   help="a kernel probe's dense_probe.json or bench/decode_gemm_bench.py's decode_gemm.json")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    data = json.loads(a.source.read_text())
    shapes = from_decode_gemm(data) if "cases" in data else from_probe(data)
    for path in write(shapes, a.out, data.get("triton"), data.get("device", "NVIDIA H200")):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
