"""vLLM's CLI as the launcher runs it, in the launcher's own process or exec'd in a fresh interpreter: first the
launcher's handling of an engine death under several API server processes (serving/lmi/engine_watch.py
`end_api_servers_on_engine_death`, which only the process running `vllm serve` can install) and vLLM's keep-alive
switch where engine auto-recovery is on (serving/recovery.py), then vLLM's main.

    python -m serving.engine_cli serve MODEL [vLLM's flags]    # what `vllm serve MODEL [vLLM's flags]` runs
"""
from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    """Run vLLM's CLI with argv (`serve MODEL ...`) in this process."""
    from vllm.entrypoints.cli.main import main as vllm_main

    from .lmi.engine_watch import end_api_servers_on_engine_death
    from .recovery import keep_alive_environment

    sys.argv = ["vllm", *argv]
    for name, value in keep_alive_environment(os.environ, argv).items():
        os.environ.setdefault(name, value)  # a value the user set wins
    end_api_servers_on_engine_death()
    vllm_main()


if __name__ == "__main__":
    main(sys.argv[1:])
