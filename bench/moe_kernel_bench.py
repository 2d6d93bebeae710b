#!/usr/bin/env python3
"""The H200 fused-MoE kernel harness, run from a checkout: `python3 bench/moe_kernel_bench.py --help`.

The harness is the package bench/moe/ (`python3 -m bench.moe` from the repository root is the
same command). Run as a script, Python puts bench/ first on the path; the repository root goes
there instead, so bench.moe and serving import as they do everywhere else.
"""
import sys
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.moe.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
