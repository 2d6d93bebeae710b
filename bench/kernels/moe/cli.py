"""The harness's command line (python -m bench.kernels.moe)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from . import __doc__ as DESCRIPTION
from .modes import MODES
from .shapes import SHAPES, TP8_SHAPES, TUNER_MS


def parse_plan(s):
    # "shape:M1,M2;shape2:all"
    plan = []
    for part in s.split(";"):
        if not part.strip():
            continue
        name, ms = part.split(":")
        if ms == "all":
            mm = TUNER_MS
        elif ms == "small":
            mm = [m for m in TUNER_MS if m <= 64]
        elif ms == "large":
            mm = [m for m in TUNER_MS if m > 64]
        else:
            mm = [int(x) for x in ms.split(",")]
        plan.append((name.strip(), mm))
    return plan


def _names(s):
    return [x for x in s.split(",") if x]


def _ints(s):
    return [int(x) for x in s.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.kernels.moe", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fused-moe-py", required=True, help="vLLM fused_moe.py (stock)")
    ap.add_argument("--patched-fused-moe-py", default=None, help="do_not_specialize-patched fused_moe.py")
    ap.add_argument("--stock-configs-dir", default=None, help="vLLM configs/ dir (default: beside fused_moe.py)")
    ap.add_argument("--configs-dir", default=None, help="our tuned configs (VLLM_TUNED_CONFIG_FOLDER)")
    ap.add_argument("--prev-configs-dir", default=None, help="bench: also time these configs (patched source)")
    ap.add_argument("--noswap", action="store_true", help="bench: also time stock/ours with swap-AB forced off")
    ap.add_argument("--mode", default="bench", help="comma list of: " + ", ".join(
        f"{m.name} ({m.what})" for m in MODES.values()) + "; they run in this order")
    ap.add_argument("--shapes", type=_names, default=",".join(SHAPES), help="comma list of shapes for bench/smoke")
    ap.add_argument("--smoke-shapes", type=_names, default="qwen3-235b-tp8,deepseek-v3-tp8")
    ap.add_argument("--ms", type=_ints, default=",".join(map(str, TUNER_MS)), help="token counts for bench")
    ap.add_argument("--tune-plan", type=parse_plan, default=";".join(f"{s}:small" for s in TP8_SHAPES),
                    help="'shape:M,M;shape:small|large|all' in priority order")
    ap.add_argument("--tune-with", default="patched", choices=["stock", "patched"],
                    help="kernel source to tune (patched = what the image ships)")
    ap.add_argument("--space", default="default", choices=["default", "wide"],
                    help="wide: add BM=16 narrow-N / deep-K / 2-warp candidates where tokens/expert <= 1")
    ap.add_argument("--workers", type=int, default=14, help="parallel compile processes (0: none)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-cupti", action="store_true")
    ap.add_argument("--keep-all", action="store_true")
    ap.add_argument("--topk-cupti", type=int, default=3, help="tune: re-measure this many best configs with CUPTI")
    ap.add_argument("--seeds", type=int, default=4, help="gtune: variants of this many best base configs")
    ap.add_argument("--jit-shape", default="qwen3-235b-tp8")
    ap.add_argument("--jit-max-m", type=int, default=8192)
    ap.add_argument("--jit-use-ours", action="store_true", help="per-M dispatch from --configs-dir first")
    ap.add_argument("--jit-parts", default="fixed,dispatch,steady",
                    help="comma list of: fixed, dispatch, dispatch_ext (warm-up + every config key), steady")
    ap.add_argument("--probe-configs", default="",
                    help="probe mode: comma list of configs 'M16N32K128G1w4s5' timed on both GEMMs with "
                         "swap-AB as vLLM decides, forced on and forced off")
    ap.add_argument("--jit-ss-ms", type=_ints, default="1,2,3,4,5,8,16,17,33,64,100,256,511,1024,4096,8192")
    ap.add_argument("--budget-s", type=float, default=540, help="soft deadline for the whole run")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tag", default="run")
    return ap


def main(argv=None):
    opts = build_parser().parse_args(argv)
    t_end = time.time() + opts.budget_s
    import torch
    import triton

    from .context import RunContext, dump
    from .kernel_source import kernel_decorator_text, load_kernel
    from .precompile import Precompiler
    from .timing import measure_copy_bandwidth

    os.makedirs(opts.out, exist_ok=True)
    gen_dir = os.path.join(tempfile.gettempdir(), "moe_bench_gen")
    os.environ.setdefault("MOE_BENCH_GEN_DIR", gen_dir)
    if "TRITON_CACHE_DIR" not in os.environ:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_cache_main_")

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    kstock, sha_s = load_kernel(opts.fused_moe_py, "stock")
    kpatched, sha_p = (load_kernel(opts.patched_fused_moe_py, "patched") if opts.patched_fused_moe_py
                       else (None, None))
    bw = measure_copy_bandwidth(dev)
    meta = {"device": props.name, "sms": props.multi_processor_count, "cap": torch.cuda.get_device_capability(),
            "torch": torch.__version__, "triton": triton.__version__, "copy_bw_TBps": bw / 1e12,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv, "stock_sha": sha_s,
            "patched_sha": sha_p, "stock_decorator": kernel_decorator_text(opts.fused_moe_py),
            "patched_decorator": kernel_decorator_text(opts.patched_fused_moe_py) if opts.patched_fused_moe_py else None}
    print(f"[meta] {json.dumps(meta)}", flush=True)
    dump(opts.out, f"meta_{opts.tag}.json", meta)
    modes = opts.mode.split(",")
    t0 = time.time()
    srcs = {"stock": opts.fused_moe_py, "patched": opts.patched_fused_moe_py or opts.fused_moe_py}
    run = RunContext(opts=opts, t_end=t_end, dev=dev, bw=bw, kstock=kstock, kpatched=kpatched,
                     pc=Precompiler(opts.workers, srcs))
    for mode in MODES.values():
        if mode.name in modes:
            result = mode.run(run)
            print(f"[{mode.name}] {mode.summary(result)}({time.time() - t0:.0f}s)", flush=True)
    run.pc.close()
    print(f"[main] done ({time.time() - t0:.0f}s)", flush=True)
