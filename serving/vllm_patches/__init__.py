"""What runs at image build: the vLLM patch series applied to the installed vLLM and checked.

    python -m serving.vllm_patches apply|check|list   (apply.py)

- series.py: patches/series and the patches it lists, parsed;
- apply.py: applies the series to a vllm package, checks its post-conditions, writes and reads the record;
- moe_configs.py: what a tuned fused-MoE config means (also the H200 harness's, bench/kernels/moe/).

Standard library only (tests/test_layout.py holds it): the image build runs it right after
installing vLLM, and the launcher reads the record without importing vLLM. Where patches/ and
configs/ are comes from serving/paths.py, as for the runtime.
"""
