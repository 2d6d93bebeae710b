"""Write vLLM-format fused-MoE config JSONs (configs/) from the harness's
tune results, optionally gated by a bench re-run.

Rules:
* per token count M (vLLM tuner keys) take the tuned best entry only where it
  beat the stock choice (stock tuned file entry or get_default_config) by more
  than --min-gain in the tune run; else keep the stock choice. An entry of a
  `--mode tune` run is one config for w13 AND w2; an entry of a `--mode gtune`
  run carries per-GEMM "w13"/"w2" dicts (patches 0003/0004). For the same
  shape and M a later --tune file replaces an earlier one;
* with --bench (one or more files; a later one replaces an earlier one's
  shape and M): an entry stays "ours" only where the re-run (bench mode, CUPTI
  kernel time, w13+w2) also shows ours faster than stock by more than
  --min-gain-rerun; else it reverts to the stock choice;
* a shape that stock 0.32 already has a file for is written only if at least
  one entry remains ours; a shape stock lacks is always written.
"""
from __future__ import annotations

import argparse
import json
import os

from serving.vllm_patches.moe_configs import config_file_name, get_moe_configs

from .configs import cfg_clean, cfg_str, entry_str, try_get_config
from .shapes import SHAPES, TUNER_MS


def load_tune(paths):
    """{shape: {M: {"entry", "best_total", "stock_total", "timer"}}}; a later
    file wins for the same (shape, M)."""
    res = {}
    for p in paths:
        d = json.load(open(p))
        for name, per_m in d["results"].items():
            for m, r in per_m.items():
                if r.get("best") is None:
                    continue
                if "entry" in r["best"]:  # --mode gtune (per-GEMM)
                    st = r["stock"]
                    rec = {"entry": r["best"]["entry"], "best_total": r["best"]["total_cupti_us"],
                           "stock_total": st["w13_cupti_us"] + st["w2_cupti_us"], "timer": "cupti"}
                else:  # --mode tune (one config for both GEMMs)
                    bt, stt, timer = tune_totals(r)
                    rec = {"entry": cfg_clean(r["best"]["config"]), "best_total": bt, "stock_total": stt,
                           "timer": timer}
                res.setdefault(name, {})[int(m)] = rec
    return res


def bench_totals(paths):
    """{(shape, M): {variant: (entry_str, total_us)}} from bench JSONs (CUPTI if present); a later file replaces
    an earlier one's (shape, M) whole."""
    out = {}
    for path in paths:
        out.update(_bench_totals(path))
    return out


def _bench_totals(path):
    d = json.load(open(path))
    acc = {}
    for r in d["rows"]:
        t = r.get("cupti_us")
        if t is None or t != t:
            t = r["us"]
        k = (r["shape"], r["M"])
        acc.setdefault(k, {}).setdefault(r["variant"], [r.get("entry", r["cfg"]), {}])[1][r["gemm"]] = t
    out = {}
    for k, v in acc.items():
        out[k] = {vn: (c, g.get("w13", float("inf")) + g.get("w2", float("inf"))) for vn, (c, g) in v.items()}
    return out


def tune_totals(r):
    """(best_total, stock_total, timer): CUPTI totals when the tune run has them."""
    b, s = r["best"], r["stock"]
    bc, sc = b.get("total_cupti_us"), s.get("total_cupti_us")
    if bc is not None and sc is not None and bc == bc and sc == sc:
        return bc, sc, "cupti"
    return b["total_us"], s["total_us"], "graph"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tune", nargs="+", required=True)
    ap.add_argument("--bench", nargs="+", default=None, help="bench JSONs that gate the tuned entries")
    ap.add_argument("--stock-configs-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-gain", type=float, default=0.02)
    ap.add_argument("--min-gain-rerun", type=float, default=0.01)
    ap.add_argument("--triton-version", default="3.6.0")
    ap.add_argument("--report", default=None, help="write a JSON of decisions here")
    args = ap.parse_args(argv)
    tune = load_tune(args.tune)
    bench = bench_totals(args.bench) if args.bench else {}
    os.makedirs(args.out, exist_ok=True)
    decisions = {}
    for name, sh in SHAPES.items():
        if name not in tune:
            continue
        stock_cfgs, stock_path = get_moe_configs(sh["E"], sh["N"], sh["block"], [args.stock_configs_dir])
        keys = sorted(set(TUNER_MS) | set(stock_cfgs or {}))
        entries, n_ours = {}, 0
        for M in keys:
            stock_cfg, src = try_get_config(sh, M, [args.stock_configs_dir])
            stock_cfg = cfg_clean(stock_cfg)
            r = tune[name].get(M)
            choice, why = stock_cfg, "stock"
            if r:
                bt, st, timer = r["best_total"], r["stock_total"], r["timer"]
                if st == float("inf"):
                    choice, why = r["entry"], "tuned (stock config failed check)"
                elif bt < st * (1 - args.min_gain) and entry_str(r["entry"]) != cfg_str(stock_cfg):
                    choice, why = r["entry"], f"tuned {bt:.2f} vs {st:.2f}us ({timer})"
            if why != "stock" and bench:
                b = bench.get((name, M), {})
                if "ours" in b and "stock" in b and b["ours"][0] in (entry_str(choice), cfg_str(choice)):
                    if b["ours"][1] < b["stock"][1] * (1 - args.min_gain_rerun):
                        why += f"; re-run {b['ours'][1]:.2f} vs {b['stock'][1]:.2f}us"
                    else:
                        choice, why = stock_cfg, f"stock (re-run: ours {b['ours'][1]:.2f} vs {b['stock'][1]:.2f}us)"
                elif stock_path:
                    # replacing a stock-shipped entry needs a re-run that measured this very config
                    choice, why = stock_cfg, "stock (gain not re-run)"
            if why != "stock" and not why.startswith("stock"):
                n_ours += 1
            entries[M] = choice
            decisions.setdefault(name, {})[M] = {"cfg": entry_str(choice), "why": why, "stock_src": src}
        fname = config_file_name(sh["E"], sh["N"], sh["block"])
        path = os.path.join(args.out, fname)
        if stock_path and n_ours == 0:
            print(f"{name}: stock file kept (no verified gain) -> not written")
            if os.path.exists(path):
                os.remove(path)
            continue
        out = {"triton_version": args.triton_version}
        out.update({str(m): entries[m] for m in sorted(entries)})
        with open(path, "w") as f:
            json.dump(out, f, indent=4)
            f.write("\n")
        print(f"{name}: wrote {fname} ({n_ours}/{len(entries)} entries ours; stock file: {bool(stock_path)})")
    if args.report:
        with open(args.report, "w") as f:
            json.dump(decisions, f, indent=1)


if __name__ == "__main__":
    main()
