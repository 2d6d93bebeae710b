"""A prompt step's block-FP8 dense GEMMs on the GPU: vLLM's CUTLASS block-scaled kernel, which the image runs above
its small-M files, against DeepGEMM, which SGLang runs, and vLLM's Triton kernel.

    python -m bench.prompt_gemm_probe --out DIR [--presets P ...] [--tokens M ...]   (the image's Python)

The image's container has no nvcc on its paths, so its launcher turns DeepGEMM off. Its runtime carries one all the
same (serving.deep_gemm.runtime_nvcc); this probe hands it to DeepGEMM's JIT (DG_JIT_NVCC_COMPILER, with
serving.deep_gemm.CCCL_FLAG) and runs DeepGEMM through vLLM 0.32's own wrapper (vllm.utils.deep_gemm.fp8_gemm_nt)
on weights laid out as vLLM's DeepGEMM linear kernel lays them (deepgemm_post_process_fp8_weight_block) with
float32 scales (VLLM_USE_DEEP_GEMM_E8M0=0, as SGLang runs Hopper), the activations quantized as that kernel does.
Per shard's dense shape (bench.decode_gemm_bench.shard_shapes) and prompt-step token count: each kernel's first
call on the wall clock (`first_call_ms`: DeepGEMM's JIT compile for a new kernel config shows there), then
microseconds per call in CUDA graphs (bench/cuda_graph_timing.py, weights rotated as in the decode GEMM bench), the
median and range of the paired ratios over CUTLASS, and each output's error against a float32 reference. A kernel
that raises (no nvcc, a compile error, a shape it does not take) is recorded with its error, not timed; CUTLASS's
figures print all the same. Writes prompt_gemm.json and prompt_gemm.md.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from bench.decode_gemm_bench import (BLOCK, SHARD_PRESETS, block_fp8_weight, cell, failure, finish, measured,
                                     rotating, shard_shapes, weight_sets)
from serving.deep_gemm import CCCL_FLAG, COMPILER_ENV, runtime_cuda_home, runtime_nvcc

PROMPT_TOKENS = (128, 512, 2048, 8192)  # one 128-token prompt up to vLLM's max_num_batched_tokens in the image
DEFAULT_PRESETS = ("qwen3-235b-a22b-ep8", "qwen3-coder-480b-a35b-ep8", "deepseek-v3-ep8")


RUNTIME_HEADER = "cuda_runtime.h"  # the nvidia-cuda-runtime wheel's, in nvidia/cu13/include


def runtime_headers(paths) -> Path | None:
    """The first nvidia/cu13/include under `paths` (sys.path's entries) that holds the CUDA runtime's headers."""
    for p in paths:
        include = Path(p) / "nvidia" / "cu13" / "include"
        if (include / RUNTIME_HEADER).is_file():
            return include
    return None


def deep_gemm_env(site_packages: Path, env=os.environ, paths=tuple(sys.path)) -> dict[str, str]:
    """The environment DeepGEMM's JIT needs here: the runtime's nvcc and its CUDA folder as CUDA_HOME (unless an
    nvcc is named already), the CCCL flag added to any NVCC_APPEND_FLAGS, DeepGEMM on, float32 scales. Where the CUDA
    runtime's wheel lies in another site than the nvcc's (a venv over a host's site-packages that has it, as on the
    lease hosts: run 38's compile found no cuda_runtime.h), its headers are added with -I; in the image one venv holds
    both."""
    flags = [env.get("NVCC_APPEND_FLAGS", ""), CCCL_FLAG]
    out = {"VLLM_USE_DEEP_GEMM": "1", "VLLM_USE_DEEP_GEMM_E8M0": "0"}
    nvcc = runtime_nvcc(site_packages)
    if COMPILER_ENV not in env and nvcc is not None:
        home = runtime_cuda_home(nvcc)
        out[COMPILER_ENV] = str(nvcc)
        out["CUDA_HOME"] = str(home)
        include = runtime_headers(paths) if not (home / "include" / RUNTIME_HEADER).is_file() else None
        if include is not None:
            flags.append(f"-I{include}")
    out["NVCC_APPEND_FLAGS"] = " ".join(f for f in flags if f)
    return out


def cases(tokens, presets, out: dict, rows: list[str]) -> None:
    from vllm.model_executor.kernels.linear.scaled_mm.cutlass import cutlass_scaled_mm
    from vllm.model_executor.layers.quantization.utils import fp8_utils
    from vllm.utils import deep_gemm

    dense, _ = shard_shapes(presets)
    for name, (n, k) in dense.items():
        w, ws, w_ref = block_fp8_weight(n, k)
        sets = weight_sets(w, ws)
        try:  # the weights as vLLM's DeepGEMM linear kernel lays them out, float32 scales
            dg_sets, dg_failed = [fp8_utils.deepgemm_post_process_fp8_weight_block(
                a.clone(), b.clone(), (BLOCK, BLOCK), False) for a, b in sets], {}
        except Exception as e:  # no DeepGEMM here: its arm is recorded failed in each case
            dg_sets, dg_failed = [], {"deep_gemm": failure(e)}
        for m in tokens:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            xq_c, xs_c = fp8_utils.per_token_group_quant_fp8(x, BLOCK, column_major_scales=True)
            xq_t, xs_t = fp8_utils.per_token_group_quant_fp8(x, BLOCK)
            xq_d, xs_d = fp8_utils.per_token_group_quant_fp8(x, BLOCK, column_major_scales=True,
                                                             tma_aligned_scales=True, use_ue8m0=False)
            ref = (xq_t.float() * xs_t.repeat_interleave(BLOCK, 1)) @ w_ref.T

            def dg(w, ws):
                y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                deep_gemm.fp8_gemm_nt((xq_d, xs_d), (w, ws), y, is_deep_gemm_e8m0_used=False)
                return y

            arms = {"cutlass": rotating(lambda w, ws: cutlass_scaled_mm(xq_c, w, xs_c, ws, [BLOCK, BLOCK],
                                                                        torch.bfloat16), sets),
                    "triton": rotating(lambda w, ws: fp8_utils.w8a8_triton_block_scaled_mm(
                        xq_t, w, xs_t, ws, [BLOCK, BLOCK], torch.bfloat16), sets)}
            if dg_sets:
                arms["deep_gemm"] = rotating(dg, dg_sets)
            case = out[f"dense {name} M={m}"] = {"n": n, "k": k, "m": m, **measured(arms, ref, "cutlass", dg_failed)}
            us, ratio = case["us"], case["ratio"]
            if not us:
                rows.append(f"| {name} | {n} x {k} | {m} | failed: {case['failed']} | | | | |")
                continue
            rows.append(f"| {name} | {n} x {k} | {m} | {us['cutlass']:.2f} | {cell(us, ratio, 'deep_gemm')} | "
                        f"{case['first_call_ms'].get('deep_gemm', '-')} | {cell(us, ratio, 'triton')} | "
                        f"{max(case['errors'].values()):.1e} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--presets", nargs="+", choices=SHARD_PRESETS, default=DEFAULT_PRESETS,
                   help="the shards whose dense layers to time (default: the three EP8 ranks)")
    p.add_argument("--tokens", nargs="+", type=int, default=PROMPT_TOKENS, help="a prompt step's token counts")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("prompt_gemm_probe: no CUDA device here; it times GPU kernels")
    env = deep_gemm_env(Path(torch.__file__).resolve().parents[1])
    os.environ.update(env)  # before vLLM reads its environment and DeepGEMM its compiler
    torch.manual_seed(0)
    results = {"device": torch.cuda.get_device_name(), "env": env, "cases": {}}
    rows = ["| layer | N x K | tokens | CUTLASS us | DeepGEMM us (/CUTLASS) | DeepGEMM first call ms | Triton as vLLM "
            "runs it us (/CUTLASS) | max rel. error |", "|---|---|---|---|---|---|---|---|"]
    cases(a.tokens, a.presets, results["cases"], rows)
    return finish(a.out, "prompt_gemm", results, "\n".join(rows) + f"\n\nenvironment: {env}")


if __name__ == "__main__":
    sys.exit(main())
