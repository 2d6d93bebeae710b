"""fused_moe_kernel launched with and without programmatic dependent launch (PDL), on an H200.

The kernel with PDL is the one of bench/data/h200_pdl/0009-fused-moe-programmatic-dependent-launch.patch (applied
after the series; not in it: measured slower, bench/RESULTS-archive.md "Kernel run 14").

One rank's decode MoE, `--layers` deep, in one CUDA graph per arm: each layer runs a small elementwise kernel (a
stand-in for the quantization before each GEMM), w13, another such kernel, then w2, with the shipped
config's entry for M (split-K off: the PDL patch leaves patch 0004's split-K kernel as it is), weights rotating over
enough sets that they stream from HBM. The arms alternate; each replay is timed with CUDA events.

    python3 bench/moe_pdl_bench.py --fused-moe-py PATCHED_fused_moe.py --out DIR [--shape qwen3-235b-ep8]

Prints and writes (DIR/moe_pdl.json, DIR/moe_pdl.md): per M, both arms' outputs bitwise equal or not, and the
graph's time per layer with PDL off and on, their ratio (median of the alternating repetitions, with the range).
No vLLM import: the kernel is cut out of the given file (bench/moe/kernel_source.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.moe.kernel_source import load_kernel  # noqa: E402
from bench.moe.problem import Inputs, Weights, launch  # noqa: E402
from bench.moe.shapes import SHAPES  # noqa: E402
from serving.vllm_patches.moe_configs import get_moe_configs, nearest_config  # noqa: E402

PDL = {"USE_PDL": True, "launch_pdl": True}


def entry_without_split_k(entry: dict) -> dict:
    """The shipped entry, every SPLIT_K removed (the PDL patch launches only the unsplit kernel with PDL)."""
    out = {k: v for k, v in entry.items() if k != "SPLIT_K"}
    for gemm in ("w13", "w2"):
        if gemm in entry:
            out[gemm] = {k: v for k, v in entry[gemm].items() if k != "SPLIT_K"}
    return out


def layer_graph(kmod, shape, inp, w13, w2, config, layers, extra, scratch):
    """A CUDA graph of `layers` decode MoE layers (the last output kept in inp.C1/C2)."""
    def step(i):
        scratch.mul_(1.0)
        launch(kmod, shape, "w13", inp, w13, i % len(w13.B), config, extra=extra)
        scratch.mul_(1.0)
        launch(kmod, shape, "w2", inp, w2, i % len(w2.B), config, extra=extra)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(2):  # compiles and warms both kernels outside the capture
            step(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(layers):
            step(i)
    torch.cuda.synchronize()
    return g


def time_graph(g, replays=20) -> float:
    """Milliseconds per replay: the median of `replays` timed replays after two untimed."""
    for _ in range(2):
        g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fused-moe-py", required=True, help="vLLM's fused_moe.py with the series and the PDL patch")
    p.add_argument("--configs-dir", default=str(ROOT / "configs"))
    p.add_argument("--shape", default="qwen3-235b-ep8", choices=sorted(SHAPES))
    p.add_argument("--ms", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--layers", type=int, default=94)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--sets", type=int, default=8, help="weight sets the layers rotate over")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe_pdl_bench: no CUDA device here; this bench runs on a GPU host", file=sys.stderr)
        return 2
    kmod, sha = load_kernel(a.fused_moe_py, "patched")
    if "USE_PDL" not in kmod.fused_moe_kernel.arg_names:
        print(f"moe_pdl_bench: {a.fused_moe_py} has no USE_PDL in fused_moe_kernel (the PDL patch)", file=sys.stderr)
        return 2
    shape = SHAPES[a.shape]
    configs, path = get_moe_configs(shape["E"], shape["N"], shape["block"], [a.configs_dir])
    if configs is None:
        print(f"moe_pdl_bench: no config file for {a.shape} in {a.configs_dir}", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    w13 = Weights(shape, "w13", a.sets, dev, seed=1)
    w2 = Weights(shape, "w2", a.sets, dev, seed=2)
    scratch = torch.zeros(4096, device=dev, dtype=torch.bfloat16)
    results = {"device": torch.cuda.get_device_name(), "kernel_sha": sha, "config_file": path, "shape": a.shape,
               "layers": a.layers, "ms": {}}
    for m in a.ms:
        key, entry = nearest_config(configs, m)
        config = entry_without_split_k(entry)
        inp = Inputs(shape, m, dev, torch.Generator(device=dev).manual_seed(m))
        outs = {}
        for arm, extra in (("plain", None), ("pdl", PDL)):
            launch(kmod, shape, "w13", inp, w13, 0, config, extra=extra)
            launch(kmod, shape, "w2", inp, w2, 0, config, extra=extra)
            torch.cuda.synchronize()
            outs[arm] = (inp.C1.clone(), inp.C2.clone())
        equal = all(torch.equal(x, y) for x, y in zip(outs["plain"], outs["pdl"]))
        graphs = {arm: layer_graph(kmod, shape, inp, w13, w2, config, a.layers, extra, scratch)
                  for arm, extra in (("plain", None), ("pdl", PDL))}
        ms_per = {"plain": [], "pdl": []}
        for _ in range(a.reps):
            for arm in ("plain", "pdl"):
                ms_per[arm].append(time_graph(graphs[arm]))
        ratios = sorted(q / p_ for p_, q in zip(ms_per["plain"], ms_per["pdl"]))
        r = {"config_key": key, "outputs_bitwise_equal": equal,
             "us_per_layer": {arm: round(1e3 * statistics.median(v) / a.layers, 3) for arm, v in ms_per.items()},
             "pdl_over_plain": round(statistics.median(ratios), 4), "range": [round(ratios[0], 4),
                                                                              round(ratios[-1], 4)]}
        results["ms"][str(m)] = r
        print(f"M={m}: equal={equal} plain {r['us_per_layer']['plain']} us/layer, pdl {r['us_per_layer']['pdl']} "
              f"us/layer, pdl/plain {r['pdl_over_plain']} ({r['range'][0]}-{r['range'][1]})", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe_pdl.json").write_text(json.dumps(results, indent=1))
    rows = ["| M | config entry | outputs equal | plain µs/layer | PDL µs/layer | PDL/plain (range) |",
            "|---|---|---|---|---|---|"]
    rows += [f"| {m} | {r['config_key']} | {r['outputs_bitwise_equal']} | {r['us_per_layer']['plain']} | "
             f"{r['us_per_layer']['pdl']} | {r['pdl_over_plain']} ({r['range'][0]}-{r['range'][1]}) |"
             for m, r in results["ms"].items()]
    (out / "moe_pdl.md").write_text(f"{results['device']}, {a.shape}, {a.layers} layers\n\n" + "\n".join(rows) + "\n")
    return 0 if all(r["outputs_bitwise_equal"] for r in results["ms"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
