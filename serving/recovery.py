"""Engine auto-recovery in place (the AWS vLLM image's ENGINE_AUTO_RECOVERY and ENGINE_MAX_START_RETRIES).

When the engine core dies and no stop was asked for, the API server process keeps listening, and:
- /ping answers 503 and requests fail with vLLM's engine-dead error (streams in flight end with their error record)
  for as long as the dead engine client is the app's;
- a new engine client (and with it new engine processes) is built from the same arguments vLLM started with, off
  the event loop; the app's serving state is then built for it and swapped in at once: /ping answers 200 again;
- at most `max_start_retries` starts over the process's life, each attempt counted whether it serves or not; a death
  after the last, or a failed last attempt, exits ExitCode.ENGINE_DIED as without recovery.

Recovery applies where the API server process owns its engine (one API server process, one data-parallel rank):
with several API server processes the engine processes belong to the launcher's process and their addresses were
handed to every API server at start, so the container exits ExitCode.ENGINE_DIED as before.

vLLM's own watchdog stops the HTTP server when the engine client it was started with errs; with recovery on, the
engine process runs with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 (vLLM's switch against that) and the engine watch
(serving/lmi/engine_watch.py) decides: recover, or exit.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Mapping

from .settings import engine_value

log = logging.getLogger("vllm.lmi")

KEEP_ALIVE_ENV = "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH"
OLD_ENGINE_STOP_S = 5.0  # for vLLM's monitor to stop what is left of the dead engine's processes


@dataclass
class Recovery:
    enabled: bool
    max_start_retries: int
    starts: int = 0  # engine starts made after a death

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Recovery":
        return cls(bool(engine_value("engine_auto_recovery", env)),
                   int(engine_value("engine_max_start_retries", env)))

    @property
    def left(self) -> int:
        return max(self.max_start_retries - self.starts, 0) if self.enabled else 0

    def refusal(self, client) -> str | None:
        """Why a dead engine of `client` is not started again here; None where it is."""
        if not self.enabled:
            return "engine_auto_recovery is off"
        if not self.left:
            return f"the engine was started again {self.starts} time(s), engine_max_start_retries allows no more"
        core = getattr(client, "engine_core", None)
        if getattr(getattr(core, "resources", None), "engine_manager", None) is None:
            return "this API server process does not own the engine processes (several API server processes)"
        if getattr(client, "_client_count", 1) != 1:
            return "the engine is shared by several API server processes"
        return None


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def keep_alive_environment(env: Mapping[str, str], argv: list[str]) -> dict[str, str]:
    """What the engine process's environment needs for recovery: vLLM's keep-alive switch where recovery is on and
    `vllm serve argv` runs one API server process (no --api-server-count or data parallelism above 1); the engine
    watch then exits itself once recovery is spent. Elsewhere vLLM's own stop on an engine death stays."""
    if not engine_value("engine_auto_recovery", env):
        return {}
    for flag in ("--api-server-count", "--data-parallel-size"):
        value = _flag_value(argv, flag)
        if value is not None and value.strip() not in ("0", "1"):
            return {}
    return {KEEP_ALIVE_ENV: "1"}


def _retire(client) -> None:
    """Let vLLM stop what is left of a dead client's engine processes and close its sockets."""
    core = getattr(client, "engine_core", None)
    fin = getattr(core, "_finalizer", None)
    deadline = time.monotonic() + OLD_ENGINE_STOP_S
    while fin is not None and fin.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    for part in (core, getattr(client, "renderer", None)):
        try:
            if part is not None:
                part.shutdown()
        except Exception as e:  # noqa: BLE001 -- a dead engine's clean-up must not stop the new start
            log.warning("clean-up of the dead engine client: %s", e)


def _new_client(args):
    """A new engine client as vLLM's `build_async_engine_client` makes it for one API server (blocking: the engine
    processes start and load the model)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = AsyncEngineArgs.from_cli_args(args)
    try:
        from vllm.entrypoints.launchers.cli_args import propagate_flash_late_interaction
        propagate_flash_late_interaction(args, engine_args)
    except ImportError:
        pass
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    return AsyncLLM.from_vllm_config(
        vllm_config=vllm_config, usage_context=UsageContext.OPENAI_API_SERVER,
        enable_log_requests=engine_args.enable_log_requests,
        aggregate_engine_logging=engine_args.aggregate_engine_logging,
        disable_log_stats=engine_args.disable_log_stats)


async def start_again(state, old):
    """Build a new engine client from the app's arguments and swap it, with serving state built for it, into the app
    `state` at once; returns the new client. The dead client `old` stays the app's until then (/ping: 503)."""
    from starlette.datastructures import State
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state

    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, _retire, old)
    new = await loop.run_in_executor(None, _new_client, state.args)
    try:
        await new.reset_mm_cache()
        fresh = State()
        await init_app_state(new, fresh, state.args, await new.get_supported_tasks())
    except BaseException:
        new.shutdown()
        raise
    for key, value in fresh._state.items():
        setattr(state, key, value)
    return new
