"""Patch 0010's small-M files (configs/N=<N>,K=<K>,...,small_m.json) from bench/kernels/decode_gemm.py's timings.

    python -m bench.kernels.small_m_configs --from bench/data/h200_block_17/decode/decode_gemm.json --out configs
    python -m bench.kernels.small_m_configs --from OUT/decode/decode_gemm.json --out DIR

Per block-FP8 dense shape and token count (up to --max-tokens), the decode GEMM bench's best split-K config where
it was faster than CUTLASS in every paired repetition, in the image's stack, else null (CUTLASS). A shape where it
never won gets no file; trailing nulls are left out (CUTLASS runs above the largest entry anyway). An entry serves
every token count above the next smaller entry up to its own (patch 0010's rule), so a token count that was not
timed takes the next larger one's kernel. --fused-input-quant NxK marks a shape's file "fused_input_quant": true
(its layer's op then takes the bf16 input: for a layer whose input no fusion pass quantizes, such as o_proj) and
judges its entries on the bench's split-K kernel quantizing its bf16 input against quantization + CUTLASS. --base DIR
keeps the entries of DIR's file for a shape (the device's own, else the H200's, as the image reads them) at every
token count the bench did not time, and that file's fused_input_quant: a bench of larger token counts then adds to
the shipped entries rather than replacing them. Writes one file per shape; prints what it wrote.

    python -m bench.kernels.small_m_configs --gemv-from PROBE.json ... [--gemv-shapes NAME ...] --base DIR --out DIR

--gemv-from takes recorded dense GEMV probes instead (patch 0010's matrix-vector kernel against its split-K kernel,
per named shape and token count): each token count where the best GEMV dict beat the split-K kernel's best in the
same probe gets a GEMV entry, laid over DIR's file of the shape (--base) or in a file of its own.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

BLOCK = 128
KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "SPLIT_K", "num_warps", "num_stages")
FUSED_RATIO = "split-K quantizing/quant + cutlass"  # bench/kernels/decode_gemm.py's paired ratio for fused_input_quant


def file_name(n: int, k: int, device: str = "NVIDIA_H200") -> str:
    # patch 0010's lmi_small_m_config_file_name; vLLM names the device by get_device_name_as_file_name()
    return f"N={n},K={k},device_name={device.replace(' ', '_')},dtype=fp8_w8a8,block_shape=[{BLOCK},{BLOCK}],small_m.json"


Entries = dict[int, dict | None]  # token count -> its entry as a file holds it, or None: CUTLASS


def from_decode_gemm(data: dict, max_tokens: int | None = None,
                     fused_input_quant: set[tuple[int, int]] = frozenset()) -> dict[tuple[int, int], Entries]:
    """Per shape, its entries; a fused_input_quant shape's are judged on the split-K kernel quantizing its bf16 input
    against quantization + CUTLASS, the others' on the split-K kernel against CUTLASS."""
    shapes: dict[tuple[int, int], Entries] = {}
    for name, case in data["cases"].items():
        if not name.startswith("dense ") or (max_tokens and case["m"] > max_tokens):
            continue
        fused = (case["n"], case["k"]) in fused_input_quant
        ratio = case.get("ratio", {}).get(FUSED_RATIO if fused else "triton split-K")
        won = bool(ratio and case.get("best_split_k_config") and ratio[2] < 1.0)  # in every paired repetition
        config = {key: case["best_split_k_config"][key] for key in KEYS} if won else None
        shapes.setdefault((case["n"], case["k"]), {})[case["m"]] = config
    return {shape: kept for shape, entries in shapes.items() if (kept := without_trailing_nulls(entries))}


def without_trailing_nulls(entries: Entries) -> Entries:
    """The entries by token count without the null (CUTLASS) ones above the largest config: CUTLASS runs there
    anyway."""
    entries = dict(sorted(entries.items()))
    while entries and entries[max(entries)] is None:
        del entries[max(entries)]
    return entries


def base_file(base: Path, n: int, k: int, device: str) -> tuple[Entries, bool]:
    """The shape's file in `base` (the device's own, else the H200's, which the image reads on a device without its
    own): its entries by token count and its fused_input_quant; none and False without a file."""
    for name in (file_name(n, k, device), file_name(n, k)):
        if (base / name).is_file():
            body = json.loads((base / name).read_text())
            return {int(m): c for m, c in body.items() if m.isdigit()}, bool(body.get("fused_input_quant"))
    return {}, False


def over_base(shapes: dict[tuple[int, int], Entries],
              bases: dict[tuple[int, int], Entries]) -> dict[tuple[int, int], Entries]:
    """Each shape's entries laid over its base entries: the base's at the token counts the bench did not time stay;
    a null (CUTLASS) entry at the top is left out, as from_decode_gemm leaves it. A shape the bench gave no entry
    keeps its base file as it is (no file written)."""
    merged = {shape: without_trailing_nulls({**bases.get(shape, {}), **entries}) for shape, entries in shapes.items()}
    return {shape: entries for shape, entries in merged.items() if entries}


def write(shapes: dict[tuple[int, int], Entries], out: Path, triton_version: str, device: str,
          fused_input_quant: set[tuple[int, int]] = frozenset()) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for (n, k), entries in sorted(shapes.items()):
        body: dict[str, object] = {"triton_version": triton_version}
        if (n, k) in fused_input_quant:
            body["fused_input_quant"] = True
        body.update({str(m): entries[m] for m in sorted(entries)})
        path = out / file_name(n, k, device)
        path.write_text(json.dumps(body, indent=4) + "\n")
        written.append(path)
    return written


def as_gemv_dict(config: dict) -> dict | None:
    """A probe's best GEMV config as patch 0010's GEMV dict: probes name either the dict's keys or the kernel's
    (BLOCK_N, BLOCK_K, SPLIT_K); a config that split K has no GEMV dict (the patch's kernel does not split)."""
    if "BLOCK_SIZE_N" in config:
        return dict(config)
    if config.get("SPLIT_K", 1) != 1:
        return None
    return {"BLOCK_SIZE_N": config["BLOCK_N"], "BLOCK_SIZE_K": config["BLOCK_K"], "num_warps": config["num_warps"],
            "num_stages": config["num_stages"]}


def gemv_files(probes: list[dict], base: Path | None, out: Path, shapes: list[str] | None = None) -> list[Path]:
    """For each (shape, tokens) whose best GEMV dict over the given probes beat the split-K kernel's best in the same
    probe, the shape's file in `base` with a GEMV entry at that token count, or a file holding that entry alone; only
    the named shapes' (the probes' shape names), if given. Written to out; returns their paths."""
    best_rows: dict[tuple[int, int, int], dict] = {}
    for res in probes:
        for r in res["rows"]:
            if shapes is not None and r["shape"] not in shapes:
                continue
            g, sm = r.get("gemv"), r.get("small_m")
            if g and as_gemv_dict(g["config"]) and (sm is None or g["us"] < sm["us"]):
                key = (r["N"], r["K"], r["M"])
                if key not in best_rows or g["us"] < best_rows[key]["gemv"]["us"]:
                    best_rows[key] = {**r, "device": res["device"]}
    files: dict[Path, dict] = {}
    for (n, k, m), r in sorted(best_rows.items()):
        name = file_name(n, k, r["device"])
        path = out / name
        if path not in files:
            old = base / name if base is not None else None
            files[path] = json.loads(old.read_text()) if old is not None and old.exists() else {}
        files[path][str(m)] = {"GEMV": as_gemv_dict(r["gemv"]["config"])}
    out.mkdir(parents=True, exist_ok=True)
    for path, entries in files.items():
        flags = {key: v for key, v in entries.items() if not key.isdigit()}
        counts = {key: entries[key] for key in sorted((key for key in entries if key.isdigit()), key=int)}
        path.write_text(json.dumps({**flags, **counts}, indent=4) + "\n")
    return sorted(files)


def shape(text: str) -> tuple[int, int]:
    n, _, k = text.partition("x")
    if not (n.isdigit() and k.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NxK, e.g. 4096x1024")
    return int(n), int(k)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--from", dest="source", type=Path, help="bench/kernels/decode_gemm.py's decode_gemm.json")
    source.add_argument("--gemv-from", nargs="+", type=Path, metavar="JSON",
                        help="recorded dense GEMV probes: their GEMV entries laid over --base's files")
    p.add_argument("--gemv-shapes", nargs="+", metavar="NAME",
                   help="with --gemv-from: only these shapes of the probes (default: every shape they hold)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-tokens", type=int, help="leave out larger token counts")
    p.add_argument("--fused-input-quant", nargs="+", default=[], metavar="NxK", type=shape,
                   help="shapes whose layer's input no fusion pass quantizes (o_proj), where the bench's split-K "
                        "kernel quantizing its bf16 input beat quantization + CUTLASS: their files ask for it")
    p.add_argument("--base", type=Path, metavar="DIR",
                   help="keep DIR's entries (configs/) at the token counts the bench did not time")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser()
    a = p.parse_args(argv)
    if a.base is not None and not a.base.is_dir():
        p.error(f"--base {a.base}: no such folder")
    return a


def main() -> int:
    a = parse_args()
    if a.gemv_from:
        for path in gemv_files([json.loads(f.read_text()) for f in a.gemv_from], a.base, a.out, a.gemv_shapes):
            print(path)
        return 0
    data = json.loads(a.source.read_text())
    fused = set(a.fused_input_quant)
    timed = {(c["n"], c["k"]) for name, c in data["cases"].items() if name.startswith("dense ")}
    bases = {shape: base_file(a.base, *shape, data["device"]) for shape in timed} if a.base is not None else {}
    fused |= {shape for shape, (_, flag) in bases.items() if flag}
    shapes = from_decode_gemm(data, a.max_tokens, fused)
    if bases:
        shapes = over_base(shapes, {shape: entries for shape, (entries, _) in bases.items()})
    for path in write(shapes, a.out, data["triton"], data["device"], fused):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
