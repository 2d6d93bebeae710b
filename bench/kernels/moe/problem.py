"""Problem data: random fp8 weights and routed inputs of one shape, the float32
reference, the correctness check, and the per-shape context that sizes weight
and input sets so a timing rotation is not served from L2.
"""
from __future__ import annotations

import math

import torch

from .configs import gemm_config
from .launch import invoke, prepare_assignment
from .shapes import SHAPES, gemm_dims


L2_BYTES = 60 * 1024 * 1024
# the bytes a rotation's sets touch in one cycle: over three times L2, so that each launch reads them from HBM
ROTATED_BYTES = 3 * L2_BYTES


def wdtype(dev):
    # the Triton interpreter (CPU tests) cannot hold fp8: use fp32 values there
    return torch.float8_e4m3fn if dev.type == "cuda" else torch.float32


class Weights:
    """n_sets copies of (B, B_scale) for one GEMM of one shape."""

    def __init__(self, shape, gemm, n_sets, dev, seed=0, random=True):
        E = shape["E"]
        Nout, K = gemm_dims(shape, gemm)
        g = torch.Generator(device=dev).manual_seed(seed)
        self.B, self.Bs = [], []
        for _ in range(n_sets):
            if random:
                b = torch.empty((E, Nout, K), device=dev, dtype=wdtype(dev))
                for e0 in range(0, E, 16):  # chunked: bounded fp32 temporaries
                    b[e0:e0 + 16] = torch.randn((min(16, E - e0), Nout, K), generator=g, device=dev).to(b.dtype)
            else:  # compile-only (worker processes): contents irrelevant
                b = torch.zeros((E, Nout, K), device=dev, dtype=wdtype(dev))
            self.B.append(b)
            if shape["block"] is None:
                s = torch.rand((E,), generator=g, device=dev) * 0.01 + 0.005
            else:
                bn, bk = shape["block"]
                s = torch.rand((E, -(-Nout // bn), -(-K // bk)), generator=g, device=dev) * 0.01 + 0.005
            self.Bs.append(s)
        self.bytes_per_expert = Nout * K  # fp8


def dequant_w(B, Bs, block):
    Bf = B.float()
    if block is None:
        return Bf * Bs.view(-1, 1, 1)
    bn, bk = block
    s = Bs.repeat_interleave(bn, dim=1).repeat_interleave(bk, dim=2)[:, : Bf.shape[1], : Bf.shape[2]]
    return Bf * s


def dequant_a(A, As, block):
    Af = A.float()
    if block is None:
        return Af * As.view(1, 1)
    bk = block[1]
    s = As.repeat_interleave(bk, dim=1)[:, : Af.shape[1]]
    return Af * s


class Inputs:
    """One routed batch of M tokens: activations of both GEMMs, routing, outputs."""

    def __init__(self, shape, M, dev, gen):
        E, topk, H, N = shape["E"], shape["topk"], shape["H"], shape["N"]
        block = shape["block"]
        self.M = M
        logits = torch.rand((M, E), generator=gen, device=dev)
        tw, ti = torch.topk(logits, topk, dim=1)
        self.topk_ids = ti.to(torch.int32).contiguous()
        self.topk_w = torch.softmax(tw, dim=1).float().contiguous()
        self.A1 = torch.randn((M, H), generator=gen, device=dev).to(wdtype(dev))
        self.A2 = torch.randn((M * topk, N), generator=gen, device=dev).to(wdtype(dev))
        if block is None:
            self.A1s = (torch.rand((1,), generator=gen, device=dev) * 0.02 + 0.01)
            self.A2s = (torch.rand((1,), generator=gen, device=dev) * 0.02 + 0.01)
        else:
            bk = block[1]
            self.A1s = torch.rand((M, -(-H // bk)), generator=gen, device=dev) * 0.02 + 0.01
            self.A2s = torch.rand((M * topk, -(-N // bk)), generator=gen, device=dev) * 0.02 + 0.01
        cdt = torch.bfloat16 if dev.type == "cuda" else torch.float32
        self.C1 = torch.empty((M, topk, 2 * N), device=dev, dtype=cdt)
        self.C2 = torch.empty((M, topk, H), device=dev, dtype=cdt)
        self.n_unique = int(torch.unique(self.topk_ids).numel())
        self._align = {}

    def assignment(self, BM, shape):
        if BM not in self._align:
            self._align[BM] = prepare_assignment(self.topk_ids, BM, shape["E"], self.M, shape["topk"])
        return self._align[BM]

    def gemm_args(self, gemm):
        if gemm == "w13":
            return self.A1, self.A1s, self.C1, False
        return self.A2, self.A2s, self.C2, True

    def floor_bytes(self, shape, gemm):
        Nout, K = gemm_dims(shape, gemm)
        M, topk = self.M, shape["topk"]
        w = self.n_unique * Nout * K
        if gemm == "w13":
            a = M * K
            c = M * topk * Nout * 2
        else:
            a = M * topk * K
            c = M * topk * Nout * 2
        return w + a + c


def launch(kmod, shape, gemm, inp: Inputs, W: Weights, wi: int, config, swap_ab=None):
    config = gemm_config(config, gemm)
    sorted_ids, expert_ids, ntpp = inp.assignment(config["BLOCK_SIZE_M"], shape)
    A, As, C, mul = inp.gemm_args(gemm)
    top_k = shape["topk"] if gemm == "w13" else 1
    invoke(kmod, A, W.B[wi], C, As, W.Bs[wi], inp.topk_w, sorted_ids, expert_ids, ntpp,
           mul, top_k, config, shape["block"], swap_ab=swap_ab)


def reference(shape, gemm, inp: Inputs, W: Weights, wi: int):
    block = shape["block"]
    A, As, C, mul = inp.gemm_args(gemm)
    top_k = shape["topk"] if gemm == "w13" else 1
    a = dequant_a(A, As, block)
    w = dequant_w(W.B[wi], W.Bs[wi], block)
    flat = inp.topk_ids.reshape(-1).long()
    out = torch.zeros((flat.numel(), w.shape[1]), device=A.device, dtype=torch.float32)
    for e in torch.unique(flat).tolist():
        idx = (flat == e).nonzero().squeeze(1)
        r = a[idx // top_k] @ w[e].t()
        if mul:
            r = r * inp.topk_w.reshape(-1)[idx].unsqueeze(1)
        out[idx] = r
    return out.view(C.shape)


# Hopper fp8 wgmma accumulates with reduced precision (the kernel passes acc=
# to tl.dot for fp8 fast accumulation), so the error vs an fp32 reference grows
# with K (measured ~2e-2 at K=6144 for every config alike); a wrong index or an
# unwritten element gives O(1) / NaN.
def check(kmod, shape, gemm, inp, W, config, ref, swap_ab=None, tol=5e-2):
    A, As, C, mul = inp.gemm_args(gemm)
    C.fill_(float("nan"))
    launch(kmod, shape, gemm, inp, W, 0, config, swap_ab=swap_ab)
    Cf = C.float()
    if torch.isnan(Cf).any():
        return False, float("nan")
    err = ((Cf - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    return err < tol, err


def n_sets_for(touched_bytes_per_launch, total_weight_bytes, max_sets, rotated_bytes=ROTATED_BYTES):
    """How many distinct (weights, inputs) sets a rotation needs so that the
    bytes one cycle touches exceed rotated_bytes (3x L2): at least 2, at most
    max_sets."""
    need = math.ceil(rotated_bytes / max(touched_bytes_per_launch, 1))
    return int(max(2, min(max_sets, need)))


class ShapeCtx:
    def __init__(self, name, dev, max_sets=16, seed=1234):
        self.name = name
        self.shape = SHAPES[name]
        self.dev = dev
        sh = self.shape
        per_exp = {g: gemm_dims(sh, g)[0] * gemm_dims(sh, g)[1] for g in ("w13", "w2")}
        # worst case (M=1): topk experts touched per launch
        touched1 = min(sh["topk"], sh["E"]) * per_exp["w13"]
        self.max_sets = n_sets_for(touched1, sh["E"] * per_exp["w13"], max_sets)
        self.W = {g: Weights(sh, g, self.max_sets, dev, seed=seed + i) for i, g in enumerate(("w13", "w2"))}
        self.inputs = {}
        self.refs = {}
        self.gen = torch.Generator(device=dev).manual_seed(seed)

    def sets_for(self, M, gemm):
        inp = self.get_inputs(M, 0)
        Nout, K = gemm_dims(self.shape, gemm)
        touched = inp.n_unique * Nout * K
        return n_sets_for(touched, self.shape["E"] * Nout * K, self.max_sets)

    def get_inputs(self, M, i):
        key = (M, i)
        if key not in self.inputs:
            self.inputs[key] = Inputs(self.shape, M, self.dev, self.gen)
        return self.inputs[key]

    def ref(self, M, gemm):
        key = (M, gemm)
        if key not in self.refs:
            self.refs[key] = reference(self.shape, gemm, self.get_inputs(M, 0), self.W[gemm], 0)
        return self.refs[key]

    def drop_m(self, M):
        for k in [k for k in self.inputs if k[0] == M]:
            del self.inputs[k]
        for k in [k for k in self.refs if k[0] == M]:
            del self.refs[k]

    def floor_s(self, M, gemm, bw):
        return self.get_inputs(M, 0).floor_bytes(self.shape, gemm) / bw

    def fns(self, kmod, M, gemm, config, swap_ab=None):
        n = self.sets_for(M, gemm)
        out = []
        for i in range(n):
            inp = self.get_inputs(M, i)
            out.append(lambda inp=inp, i=i: launch(kmod, self.shape, gemm, inp, self.W[gemm], i, config, swap_ab))
        return out
