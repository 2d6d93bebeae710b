"""The kernels the patch series changes, timed on a GPU against what vLLM runs without it.

- moe/ (`python -m bench.kernels.moe`): the fused-MoE Triton kernel cut out of a vLLM fused_moe.py (no vLLM import):
  tune, bench, compile counts; moe.make_configs and moe.gemv_configs write the fused-MoE files of configs/.
- decode_gemm: a decode step's dense block-FP8 GEMMs and routers (patch 0010's tier against CUTLASS);
  small_m_configs turns its output into patch 0010's small-M files.
- fp8_quant (patch 0006) and router_topk (patch 0007): the op against vLLM's, bytes and CUDA-graph time.
- graph_timing: the CUDA-graph timing these share.
"""
