"""H200 benchmark / tuning / JIT-count harness for vLLM 0.32's Triton fused-MoE
FP8 kernel (``fused_moe_kernel``), run WITHOUT importing vLLM.

    python3 -m bench.kernels.moe --fused-moe-py <vllm>/.../fused_moe.py [--mode ...]   (from the repository root)

The kernel source is taken from a vLLM ``fused_moe.py`` given by path (pristine
or patched): ``fused_moe_kernel`` and the jit helpers it calls are cut out with
``ast`` and written to a generated module (kernel_source), so the kernel that
runs is byte-for-byte vLLM's. Everything around it is ours and mirrors vLLM 0.32:
the launch (launch: moe_align_block_size, the expert assignment, swap-AB) and
the config lookup (configs, on serving/vllm_patches/moe_configs.py: tuned
folder first, then vLLM's own configs/, nearest key, else the fp8 default).

Modes (modes/, see --mode): smoke, jit, tune, gtune, probe, bench. Every
configuration is checked against a float32 reference on random inputs (outputs
poisoned with NaN first; problem). Timing (timing): CUDA graph of launches over
rotated input sets (weights too) so L2 does not serve repeats; median over
replays; CUPTI kernel times (torch.profiler) where asked for. Floor = bytes the
routed tokens touch (fp8 expert weights + activations + bf16 outputs) / copy
bandwidth measured in the same run. Candidate configs: space; parallel
compiles: precompile; one run's options and state: context.
"""
