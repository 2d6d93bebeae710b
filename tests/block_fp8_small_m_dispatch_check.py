"""Patch 0010's choice between CUTLASS and the small-M Triton tier, in the installed (patched) vLLM, in a process of
its own (the switch and the files are cached per process). The two GEMMs are swapped for recorders of what was
called (neither runs on a CPU); everything that chooses is vLLM's patched code: the file lookup in
VLLM_TUNED_CONFIG_FOLDER, the entry rule, the switch, batch-invariant mode, the custom op called eagerly and from a
graph that torch.compile traced once for every batch size, and the CUTLASS kernel class's check of the switch.
Prints one JSON object."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.kernels.linear.scaled_mm import cutlass
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import FP8ScaledMMLinearLayerConfig
from vllm.model_executor.layers.quantization.utils import fp8_utils
from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8Dynamic128Sym, kFp8Static128BlockSym

N, K, BLOCK = 256, 512, [128, 128]
SMALL = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, SPLIT_K=8, num_warps=4, num_stages=3)
EIGHT = dict(SMALL, BLOCK_SIZE_N=32, SPLIT_K=1)
GEMV = {"GEMV": dict(BLOCK_SIZE_N=32, BLOCK_SIZE_K=256, num_warps=4, num_stages=2)}
CALLS: list[str] = []


def reset(**env) -> None:
    for name in (fp8_utils.LMI_BLOCK_FP8_SMALL_M_ENV, fp8_utils.LMI_BLOCK_FP8_DECODE_GEMV_ENV, "VLLM_BATCH_INVARIANT"):
        os.environ.pop(name, None)
    os.environ.update(env)
    fp8_utils.lmi_small_m_enabled.cache_clear()
    fp8_utils.lmi_block_fp8_decode_gemv_enabled.cache_clear()
    fp8_utils.lmi_small_m_file.cache_clear()


def write(folder: Path, entries) -> Path:
    path = folder / fp8_utils.lmi_small_m_config_file_name(N, K, *BLOCK)
    path.write_text(json.dumps(entries))
    return path


def chosen(m: int):
    try:
        config = fp8_utils.lmi_small_m_config(m, N, K, BLOCK)
    except ValueError as e:
        return {"error": str(e)}
    return None if config is None else (
        "1" if config == SMALL else "8" if config == EIGHT else "gemv" if config == GEMV else config)


def record_tier(A, B, As, Bs, block_size, config, output_dtype):
    kernel = "GEMV" if "GEMV" in config else f"SPLIT_K={config['SPLIT_K']}"
    CALLS.append(f"tier {kernel} M={A.shape[0]}" + (f" {A.dtype} input" if As is None else ""))
    return A.new_zeros((A.shape[0], B.shape[0]), dtype=output_dtype)


def record_quant(x, group_size, column_major_scales, use_ue8m0):
    CALLS.append(f"quant M={x.shape[0]} group {group_size}" + (" column-major" if column_major_scales else ""))
    return x.to(torch.float8_e4m3fn), torch.ones(x.shape[0], x.shape[1] // group_size)


class RecordCutlass:
    @staticmethod
    def cutlass_scaled_mm(a, b, out_dtype, scale_a, scale_b):
        CALLS.append(f"cutlass M={a.shape[0]}")
        return a.new_zeros((a.shape[0], b.shape[1]), dtype=out_dtype)


def operands(m: int):
    return (torch.zeros(m, K, dtype=torch.float8_e4m3fn), torch.zeros(N, K, dtype=torch.float8_e4m3fn),
            torch.ones(m, K // 128), torch.ones(N // 128, K // 128))


def op_calls(call, ms) -> list[str]:
    CALLS.clear()
    for m in ms:
        out = call(*operands(m))
        assert out.shape == (m, N) and out.dtype == torch.bfloat16
    return list(CALLS)


def build_kernel():
    config = FP8ScaledMMLinearLayerConfig(weight_quant_key=kFp8Static128BlockSym,
                                          activation_quant_key=kFp8Dynamic128Sym, weight_shape=(N, K),
                                          input_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    try:
        with set_current_vllm_config(VllmConfig()):
            return cutlass.CutlassFp8BlockScaledMMKernel(config)
    except ValueError as e:
        return str(e)


def layer_calls(kernel, ms) -> list[str]:
    """The kernel's apply_weights on a block-FP8 layer of (N, K) for inputs of each token count (a batch of 2 x m/2
    rows where m is even: the 3-d input a model may pass)."""
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.zeros(N, K, dtype=torch.float8_e4m3fn), requires_grad=False)
    layer.weight_scale_inv = torch.nn.Parameter(torch.ones(N // 128, K // 128), requires_grad=False)
    CALLS.clear()
    for m in ms:
        x = torch.zeros(2, m // 2, K, dtype=torch.bfloat16) if m % 2 == 0 else torch.zeros(m, K, dtype=torch.bfloat16)
        with set_current_vllm_config(VllmConfig()):
            y = kernel.apply_weights(layer, x)
        assert y.shape == (*x.shape[:-1], N) and y.dtype == torch.bfloat16, (y.shape, y.dtype)
    return list(CALLS)


def main() -> None:
    out = {"file_name": fp8_utils.lmi_small_m_config_file_name(N, K, *BLOCK)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        reset()
        os.environ.pop("VLLM_TUNED_CONFIG_FOLDER", None)
        out["no_folder"] = chosen(1)
        os.environ["VLLM_TUNED_CONFIG_FOLDER"] = tmp
        out["no_file"] = chosen(1)
        write(folder, {"1": SMALL, "8": EIGHT, "16": None, "32": SMALL, "triton_version": "3.7.1"})
        reset()
        out["by_tokens"] = {m: chosen(m) for m in (0, 1, 2, 8, 9, 16, 17, 32, 33)}

        cutlass.lmi_block_fp8_small_m_mm = record_tier
        cutlass.ops = RecordCutlass
        op = torch.ops.vllm.lmi_cutlass_block_fp8_mm

        def call(a, b, a_s, b_s):
            return op(a, b, a_s, b_s, BLOCK, torch.bfloat16)

        out["eager"] = op_calls(call, (1, 5, 9, 20, 40))
        frames = []

        def backend(gm, example_inputs):
            frames.append(1)
            return gm.forward

        compiled = torch.compile(call, backend=backend, dynamic=True, fullgraph=True)
        out["compiled"] = op_calls(compiled, (3, 8, 12, 20, 5))  # one trace: M is symbolic from the first call
        out["compiled_frames"] = len(frames)
        kernel = build_kernel()
        out["built"] = {"fused_input_quant": kernel._lmi_fused_input_quant}

        # fused_input_quant: the layer's op gets the bf16 input; the tier quantizes it, CUTLASS gets it quantized
        cutlass.per_token_group_quant_fp8 = record_quant
        write(folder, {"fused_input_quant": True, "8": EIGHT})
        reset()
        fused = build_kernel()
        out["fused_built"] = {"fused_input_quant": fused._lmi_fused_input_quant}
        out["fused_calls"] = layer_calls(fused, (1, 8, 9))
        out["unfused_calls"] = layer_calls(kernel, (1,))  # vLLM's QuantFP8 first, then the op on fp8
        write(folder, {"fused_input_quant": True, "1": GEMV, "8": EIGHT})
        reset()
        out["fused_gemv_calls"] = layer_calls(build_kernel(), (1, 8))
        write(folder, {"fused_input_quant": "yes", "8": EIGHT})
        reset()
        out["bad_fused_flag"] = chosen(1)
        write(folder, {"1": SMALL, "8": EIGHT, "16": None, "32": SMALL, "triton_version": "3.7.1"})
        reset()

        reset(**{fp8_utils.LMI_BLOCK_FP8_SMALL_M_ENV: "0"})
        out["switch_off"] = chosen(1)
        out["switch_off_calls"] = op_calls(call, (1,))
        reset(VLLM_BATCH_INVARIANT="1")
        out["batch_invariant"] = chosen(1)
        reset(**{fp8_utils.LMI_BLOCK_FP8_SMALL_M_ENV: "sometimes"})
        out["bad_switch"] = chosen(1)
        out["bad_switch_build"] = build_kernel()
        assert isinstance(out["bad_switch_build"], str), "a bad switch built the kernel"

        # a GEMV entry (its own switch: off gives its token counts CUTLASS)
        write(folder, {"1": GEMV, "8": EIGHT})
        reset()
        out["gemv_by_tokens"] = {m: chosen(m) for m in (1, 2, 8, 9)}
        out["gemv_calls"] = op_calls(call, (1, 5))
        reset(**{fp8_utils.LMI_BLOCK_FP8_DECODE_GEMV_ENV: "0"})
        out["gemv_off_by_tokens"] = {m: chosen(m) for m in (1, 2)}
        reset(**{fp8_utils.LMI_BLOCK_FP8_DECODE_GEMV_ENV: "later"})
        out["gemv_bad_switch"] = chosen(1)
        out["gemv_bad_switch_beyond"] = chosen(2)  # an entry without GEMV never reads the switch

        bad_files = {
            "gemv_rows": {"1": {"GEMV": dict(GEMV["GEMV"], BLOCK_SIZE_N=3)}},
            "gemv_k": {"1": {"GEMV": dict(GEMV["GEMV"], BLOCK_SIZE_K=1024)}},
            "gemv_keys": {"1": {"GEMV": {k: v for k, v in GEMV["GEMV"].items() if k != "num_stages"}}},
            "gemv_beside": {"1": dict(GEMV, SPLIT_K=1)},
            "unknown_key": {"1": dict(SMALL, GROUP_SIZE_M=1)},
            "missing_key": {"1": {k: v for k, v in SMALL.items() if k != "SPLIT_K"}},
            "block_k": {"1": dict(SMALL, BLOCK_SIZE_K=64)},
            "not_int": {"1": dict(SMALL, SPLIT_K=2.0)},
            "not_an_object": {"1": "cutlass"},
            "bad_key": {"one": SMALL},
            "empty": {},
        }
        for name, entries in bad_files.items():
            path = write(folder, entries)
            reset()
            out[f"bad_{name}"] = chosen(1)
            out[f"bad_{name}"]["names_file"] = str(path) in out[f"bad_{name}"].get("error", "")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
