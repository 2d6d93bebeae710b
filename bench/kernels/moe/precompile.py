"""Parallel precompile: worker processes compile each config (Triton warmup, no
launch) on empty tensors of the real sizes; the main process then loads the
cubins from the shared Triton cache dir.
"""
from __future__ import annotations

import time

import torch

from .configs import GEMM_NAMES, gemm_config
from .kernel_source import load_kernel
from .launch import invoke, naive_assignment
from .problem import wdtype
from .shapes import SHAPES, gemm_dims


_W = {}


def _worker_init(srcs):
    torch.cuda.set_device(0)
    _W["kmods"] = {tag: load_kernel(path, tag)[0] for tag, path in srcs.items()}
    _W["ctx"] = {}


def _fake_problem(sh, M, gemm, BM, dev):
    """Empty tensors with the sizes/dtypes the real launch has: enough for
    Triton to compile the same specialization, launching no GPU work."""
    E, topk = sh["E"], sh["topk"]
    numel = M * topk
    if naive_assignment(M, E, topk):
        sorted_ids = None
        expert_ids = torch.empty((numel,), dtype=torch.int32, device=dev)
    else:
        mp_ = numel + E * (BM - 1)
        if numel < E:
            mp_ = min(numel * BM, mp_)
        sorted_ids = torch.empty((mp_,), dtype=torch.int32, device=dev)
        expert_ids = torch.empty((-(-mp_ // BM),), dtype=torch.int32, device=dev)
    ntpp = torch.empty((1,), dtype=torch.int32, device=dev)
    topk_w = torch.empty((M, topk), dtype=torch.float32, device=dev)
    Nout, K = gemm_dims(sh, gemm)
    rows = M if gemm == "w13" else M * topk
    A = torch.empty((rows, K), dtype=wdtype(dev), device=dev)
    if sh["block"] is None:
        As = torch.empty((1,), dtype=torch.float32, device=dev)
    else:
        As = torch.empty((rows, -(-K // sh["block"][1])), dtype=torch.float32, device=dev)
    C = torch.empty((M, topk, Nout), dtype=torch.bfloat16, device=dev)
    return A, As, C, topk_w, sorted_ids, expert_ids, ntpp


def _worker_compile(src_tag, shape_name, config, Ms, swaps=(None,), gemms=GEMM_NAMES):
    """Compile (Triton warmup, no launch) one config for the given token counts."""
    import traceback

    dev = torch.device("cuda")
    sh = SHAPES[shape_name]
    if shape_name not in _W["ctx"]:
        _W["ctx"] = {}  # one shape's weights at a time
        W = {}
        for g in ("w13", "w2"):
            Nout, K = gemm_dims(sh, g)
            B = torch.empty((sh["E"], Nout, K), dtype=wdtype(dev), device=dev)
            if sh["block"] is None:
                Bs = torch.empty((sh["E"],), dtype=torch.float32, device=dev)
            else:
                bn, bk = sh["block"]
                Bs = torch.empty((sh["E"], -(-Nout // bn), -(-K // bk)), dtype=torch.float32, device=dev)
            W[g] = (B, Bs)
        _W["ctx"][shape_name] = W
    W = _W["ctx"][shape_name]
    t0 = time.time()
    try:
        for M in Ms:
            for g in gemms:
                A, As, C, tw, sid, eid, ntpp = _fake_problem(sh, M, g, config["BLOCK_SIZE_M"], dev)
                top_k = sh["topk"] if g == "w13" else 1
                for sw in swaps:
                    invoke(_W["kmods"][src_tag], A, W[g][0], C, As, W[g][1], tw, sid, eid, ntpp,
                           g == "w2", top_k, gemm_config(config, g), sh["block"], swap_ab=sw, warmup=True)
        return True, time.time() - t0
    except Exception:  # noqa: BLE001
        return False, traceback.format_exc()[-300:]


class Precompiler:
    """Process pool that compiles into the shared TRITON_CACHE_DIR."""

    def __init__(self, workers, srcs):
        import concurrent.futures as cf
        import multiprocessing as mp

        self.futs = {}
        self.pool = None
        if workers > 0:
            self.pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                               initializer=_worker_init, initargs=(srcs,))

    def submit(self, key, *job):
        if self.pool is None or key in self.futs:
            return
        self.futs[key] = self.pool.submit(_worker_compile, *job)

    def wait(self, key, t_end):
        f = self.futs.get(key)
        if f is None:
            return True, None
        try:
            return f.result(timeout=max(1.0, t_end - time.time()))
        except Exception as ex:  # noqa: BLE001
            return False, repr(ex)

    def close(self):
        if self.pool is not None:
            for f in self.futs.values():
                f.cancel()
            self.pool.shutdown(wait=False, cancel_futures=True)
