"""The container's exit codes (beyond these, vLLM's own)."""
from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    UNHEALTHY = 1        # --healthcheck: /ping did not answer 200 (Docker's "unhealthy")
    CONFIG_ERROR = 2     # a setting stops the start; one line names the key
    DOWNLOAD_FAILED = 3  # the s3:// model could not be downloaded
    ENGINE_DIED = 4      # the engine process died while serving
