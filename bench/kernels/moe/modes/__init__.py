"""The harness's modes, one module each, run in this order by the cli (--mode picks which).

A mode is a function of the run context (context.RunContext); its module is imported only
when it runs, so `--help` needs neither torch nor Triton.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    function: str  # "<module of this package>.<function>"
    what: str  # for --help
    # the line printed when it ends, before "(<seconds>s)"
    summary: Callable[[object], str] = lambda _: "done "

    def run(self, run_context):
        module, function = self.function.rsplit(".", 1)
        return getattr(importlib.import_module(f"{__package__}.{module}"), function)(run_context)


MODES = {m.name: m for m in (
    Mode("smoke", "smoke.mode_smoke",
         "correctness of one swap-eligible config, naive and aligned, swap-AB on and off",
         summary=lambda ok: f"all ok: {ok}  "),
    Mode("jit", "jit.mode_jit",
         "Triton compiles in the serving path, stock vs patched source (needs --patched-fused-moe-py)"),
    Mode("tune", "tune.mode_tune", "one config per M for both GEMMs, searched, best re-measured with CUPTI"),
    Mode("gtune", "gtune.mode_gemm_tune", "per-GEMM configs with split-K / swap-AB variants (patches 0003/0004)"),
    Mode("probe", "probe.mode_probe",
         "CUPTI times of --probe-configs with swap-AB as vLLM decides, forced on, forced off"),
    Mode("bench", "bench.mode_bench",
         "stock vLLM vs --configs-dir (and --prev-configs-dir), fraction of the memory floor"),
)}
