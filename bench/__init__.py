"""Benchmarks, by where they run. Their figures and commands: bench/RESULTS.md; their raw output: bench/data/.

The engine, on an H200 (the image's runtime beside stock vLLM 0.32 and the peers'; the CPU engine for the tests):
- e2e/ (`python -m bench.e2e`): shard models served by each arm side by side, alternating repetitions, vLLM's own
  client as a cross-check, profile windows; e2e_pool pools paired ratios over recorded runs.

Kernels with the H200 host's own torch and Triton, vLLM's kernels cut out of its (patched) sources, no vLLM import:
- moe/ (`python3 bench/moe_kernel_bench.py`): the fused-MoE harness: tune, bench, compile counts; moe.make_configs
  and moe.gemv_configs write config files from its output;
- moe_gemv_probe (patch 0011), dense_gemv_probe (0010's matrix-vector tier), moe_pdl_bench (programmatic dependent
  launch); norm_quant_probe (RMSNorm and group quantization as torch.compile generates them) and
  inductor_kernel_probe (a kernel torch.compile generated for a served model, under each autotuner pick).

Kernels in the image's Python (vLLM imported, the series applied), on an H200:
- fp8_quant_bench (patch 0006), router_topk_bench (0007), decode_gemm_bench (the dense GEMMs of a decode step, 0010;
  small_m_configs writes its files); cuda_graph_timing times their calls, and the inductor probe's, in CUDA graphs.

HTTP against the launcher's server, on any machine (loopback):
- load (many clients, every answer checked), lmi_vs_openai (one workload through LMI and OpenAI bodies),
  api_server_cpu (the API server processes' CPU time per streamed request of a burst, on the CPU engine).

In-process, on any machine:
- middleware_overhead (the container's ASGI middleware against the bare app, a burst of streamed requests).
"""
