"""jit: Triton compiles in the serving path, stock against patched kernel source:
one fixed config over M=1..64, vLLM's per-M dispatch after its warm-up (and an
extended warm-up), and the steady-state cost of the change."""
from __future__ import annotations

import json
import os
import tempfile
import time

import torch

from ..context import RunContext
from serving.vllm_patches.moe_configs import config_file_name

from ..configs import GEMM_NAMES, cfg_str, entry_str, gemm_config, get_moe_configs, try_get_config
from ..kernel_source import kernel_decorator_text
from ..launch import naive_assignment_max_m
from ..problem import Inputs, ShapeCtx, Weights, launch
from ..shapes import SHAPES, vllm_warmup_ms
from ..timing import cupti_remeasure


class CompileCounter:
    def __init__(self):
        self.events = []
        import triton

        self.knobs = triton.knobs
        self.prev = triton.knobs.runtime.jit_post_compile_hook
        triton.knobs.runtime.jit_post_compile_hook = self

    def __call__(self, *, key=None, repr=None, fn=None, compile=None, is_manual_warmup=False, already_compiled=False):
        self.events.append((fn.name if fn is not None else "?", repr))
        return False

    def close(self):
        self.knobs.runtime.jit_post_compile_hook = self.prev


def jit_sweep(kmod, shape_name, dev, folders, ms_warm, ms_traffic, label):
    """Call w13+w2 as the serving path would; count compiles and their time."""
    import triton

    sh = SHAPES[shape_name]
    cache_dir = tempfile.mkdtemp(prefix=f"triton_cache_{label}_")
    saved_env = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    try:
        triton.knobs.cache.dir = cache_dir
    except Exception:  # noqa: BLE001
        pass
    W = {g: Weights(sh, g, 1, dev) for g in ("w13", "w2")}
    gen = torch.Generator(device=dev).manual_seed(7)
    for kname in ("fused_moe_kernel", "fused_moe_kernel_split_k"):  # forget compiles of earlier sweeps
        if hasattr(kmod, kname):
            getattr(kmod, kname).device_caches.clear()
    cc = CompileCounter()
    phases = {}
    try:
        for phase, ms in (("warmup", ms_warm), ("traffic", ms_traffic)):
            n0 = len(cc.events)
            ctime = 0.0
            new_at = []
            t_phase = time.time()
            for M in ms:
                cfg, _ = try_get_config(sh, M, folders)
                inp = Inputs(sh, M, dev, gen)
                inp.assignment(cfg["BLOCK_SIZE_M"], sh)
                torch.cuda.synchronize()
                k0 = len(cc.events)
                t0 = time.perf_counter()
                for g in ("w13", "w2"):
                    launch(kmod, sh, g, inp, W[g], 0, cfg)
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                if len(cc.events) > k0:
                    ctime += dt
                    new_at.append((M, len(cc.events) - k0, entry_str(cfg)))
            phases[phase] = {"compiles": len(cc.events) - n0, "compile_s": ctime, "wall_s": time.time() - t_phase,
                             "new_at": new_at}
    finally:
        cc.close()
        if saved_env is not None:
            os.environ["TRITON_CACHE_DIR"] = saved_env
            try:
                triton.knobs.cache.dir = saved_env
            except Exception:  # noqa: BLE001
                pass
    # distinct (GEMM, config) pairs the per-M dispatch can pick: with patch 0002
    # each should compile once (the kernel also differs per GEMM: N, K, top_k)
    n_cfg = len({(g, cfg_str(gemm_config(try_get_config(sh, M, folders)[0], g)))
                 for M in list(ms_warm) + list(ms_traffic) for g in GEMM_NAMES})
    return {"label": label, "shape": shape_name, "distinct_gemm_configs": n_cfg, **phases}


def extended_warmup_ms(shape, folders, max_tokens=8192):
    """vLLM's warm-up sizes plus one M per config-file key (so every config the
    per-M dispatch can pick is compiled) plus both sides of the naive-block-
    assignment boundary (M*top_k*4 <= E): naive_block_assignment is a
    constexpr, so a config used on both sides compiles twice. Patch 0005 makes
    vLLM's warm-up reach the same (config, path) pairs."""
    sh = shape
    ms = vllm_warmup_ms(max_tokens)
    cfgs, _ = get_moe_configs(sh["E"], sh["N"], sh["block"], folders)
    keys = sorted(cfgs) if cfgs else []
    b = naive_assignment_max_m(sh["E"], sh["topk"])
    extra = keys + ([b, b + 1] if b >= 1 else [])
    return ms + [m for m in extra if m not in ms]


def mode_jit(run: RunContext):
    kstock, kpatched, dev = run.kstock, run.kpatched, run.dev
    assert kpatched is not None, "--patched-fused-moe-py needed for jit mode"
    res = {"stock_src": run.opts.fused_moe_py, "patched_src": run.opts.patched_fused_moe_py,
           "stock_decorator": kernel_decorator_text(run.opts.fused_moe_py),
           "patched_decorator": kernel_decorator_text(run.opts.patched_fused_moe_py)}
    name = run.opts.jit_shape
    # stock = stock vLLM (its configs); patched = the image (ours first, with --jit-use-ours)
    stock_folders = [run.stock_configs_dir]
    folders = [run.opts.configs_dir, run.stock_configs_dir] if run.opts.jit_use_ours else stock_folders
    # (a) one fixed config over M=1..64: compiles per GEMM from Triton's integer specialization alone
    sh = SHAPES[name]
    fixed = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 4}
    fixed_dir = tempfile.mkdtemp(prefix="fixedcfg_")
    with open(os.path.join(fixed_dir, config_file_name(sh["E"], sh["N"], sh["block"])), "w") as f:
        json.dump({"1": fixed}, f)
    parts = run.opts.jit_parts.split(",")
    for label, km in (("stock", kstock), ("patched", kpatched)):
        if "fixed" not in parts:
            break
        r = jit_sweep(km, name, dev, [fixed_dir], [], list(range(1, 65)), f"{label}_fixedcfg")
        res[f"{label}_fixed_1_64"] = r
        print(f"[jit] fixed config {cfg_str(fixed)} M=1..64 {label}: {r['traffic']['compiles']} compiles "
              f"(w13+w2) {r['traffic']['compile_s']:.1f}s", flush=True)
    # (b) vLLM per-M dispatch, warm-up then traffic 1..8192
    ms_warm = vllm_warmup_ms()
    ms_traffic = list(range(1, run.opts.jit_max_m + 1))
    sweeps = []
    if "dispatch" in parts:
        sweeps += [("stock", kstock, ms_warm, stock_folders), ("patched", kpatched, ms_warm, folders)]
    if "dispatch_ext" in parts:
        ext_s, ext_p = extended_warmup_ms(sh, stock_folders), extended_warmup_ms(sh, folders)
        res["extended_warmup_extra_ms"] = {"stock": [m for m in ext_s if m not in ms_warm],
                                           "patched": [m for m in ext_p if m not in ms_warm]}
        sweeps += [("stock_extwarm", kstock, ext_s, stock_folders), ("patched_extwarm", kpatched, ext_p, folders)]
    for label, km, warm_ms, fl in sweeps:
        if time.time() > run.t_end:
            break
        r = jit_sweep(km, name, dev, fl, warm_ms, ms_traffic, label)
        res[label] = r
        print(f"[jit] {label:8s} {name} distinct (GEMM, config) pairs={r['distinct_gemm_configs']} "
              f"warmup: {r['warmup']['compiles']} compiles {r['warmup']['compile_s']:.1f}s; "
              f"traffic 1..{run.opts.jit_max_m}: {r['traffic']['compiles']} compiles {r['traffic']['compile_s']:.1f}s "
              f"first new at {r['traffic']['new_at'][:6]}", flush=True)
        run.dump(f"jit_{run.opts.tag}.json", res)
    # (c) steady state: stock, patched, stock again (noise), the same (stock vLLM's) per-M config
    ss = []
    ctx = ShapeCtx(name, run.dev) if "steady" in parts else None
    for M in (run.opts.jit_ss_ms if "steady" in parts else []):
        if time.time() > run.t_end:
            break
        cfg, src = try_get_config(sh, M, stock_folders)
        row = {"M": M, "cfg": cfg_str(cfg)}
        labels = (("stock_a", kstock), ("patched", kpatched), ("stock_b", kstock))
        for label, _ in labels:
            row[label] = 0.0
            row[label + "_graph"] = 0.0
        for g in ("w13", "w2"):
            recs = cupti_remeasure(ctx, M, g, [(km, cfg) for _, km in labels], reps=run.opts.reps,
                                   enabled=not run.opts.no_cupti)
            for (label, _), r in zip(labels, recs):
                row[label + "_graph"] += r["us"] if r["ok"] else float("inf")
            all_ok = all(r["ok"] for r in recs)
            for (label, _), r in zip(labels, recs):
                row[label] += r["cupti_us"] if all_ok else float("nan")
        if not all(row[label] == row[label] for label, _ in labels):  # no CUPTI: graph timer
            for label, _ in labels:
                row[label] = row[label + "_graph"]
        row["noise"] = abs(row["stock_a"] - row["stock_b"]) / min(row["stock_a"], row["stock_b"])
        row["patched_vs_stock"] = row["patched"] / (0.5 * (row["stock_a"] + row["stock_b"])) - 1
        ss.append(row)
        print(f"[jit-ss] M={M:5d} {row['cfg']:22s} stock={row['stock_a']:.2f}/{row['stock_b']:.2f}us "
              f"patched={row['patched']:.2f}us  d={row['patched_vs_stock'] * 100:+.1f}% noise={row['noise'] * 100:.1f}%",
              flush=True)
        ctx.drop_m(M)
    res["steady_state"] = ss
    run.dump(f"jit_{run.opts.tag}.json", res)
    return res
