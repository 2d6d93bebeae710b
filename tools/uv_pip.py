"""`uv pip install` into this Python's environment, configured as this machine's pip is.

    python tools/uv_pip.py UV -r requirements/cpu.txt -r requirements/test.txt

uv installs the project's virtual environment in seconds where pip takes minutes, but it reads none of pip's
configuration: the package indexes, find-links folders, constraints and CA bundle that a machine's pip.conf or PIP_*
variables set. This reads pip's own view of them (`pip config list`: the configuration files and the environment,
the environment winning) and passes each to uv as its flag. pip takes the best version across every index and
find-links folder; so does uv here (--index-strategy unsafe-best-match).

A pip setting that changes what gets installed and that this does not translate (pre, only-binary, no-binary,
prefer-binary, proxy, require-hashes, ...) makes it install with pip instead, and it says which setting did.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys

# pip's setting -> uv's flag (a setting may hold several values, whitespace-separated, each given to the flag)
FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraints", "trusted-host": "--allow-insecure-host"}
# pip's settings that change nothing uv installs (its own output, cache, timeouts, where its configuration file is),
# or that are passed otherwise
NEUTRAL = {"cert", "default-timeout", "timeout", "config-file", "disable-pip-version-check", "no-cache-dir",
           "cache-dir", "progress-bar", "quiet", "verbose", "root-user-action", "no-warn-script-location", "no-input",
           "retries", "no-color", "break-system-packages", "no-python-version-warning"}
SECTIONS = ("global", "install", ":env:")  # pip's precedence, lowest first: a later section's value replaces


def pip_settings(listing: str) -> dict[str, str]:
    """The effective value of each setting in `pip config list`'s output (lines `section.key='value'`)."""
    found: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if section in SECTIONS and value:
            found.setdefault(key, {})[section] = ast.literal_eval(value)
    return {key: next(v[s] for s in reversed(SECTIONS) if s in v) for key, v in found.items()}


def uv_command(uv: str, settings: dict[str, str], args: list[str]) -> tuple[list[str], dict[str, str]] | str:
    """(uv's command, the variables it needs) for `uv pip install args`, or the setting that stops it."""
    for key in settings:
        if key not in FLAGS and key not in NEUTRAL and key != "no-index":
            return key
    # --compile-bytecode: the .pyc files pip writes as it installs; without them every process compiles what it
    # imports (vLLM, torch, transformers) again where PYTHONDONTWRITEBYTECODE is set, as on this machine
    cmd = [uv, "pip", "install", "--python", sys.executable, "--index-strategy", "unsafe-best-match",
           "--compile-bytecode"]
    for key, flag in FLAGS.items():
        for value in settings.get(key, "").split():
            cmd += [flag, value]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        cmd.append("--no-index")
    env = {"SSL_CERT_FILE": settings["cert"]} if settings.get("cert") else {}
    timeout = settings.get("default-timeout") or settings.get("timeout")
    if timeout:
        env["UV_HTTP_TIMEOUT"] = timeout
    return cmd + args, env


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    uv, args = argv[0], argv[1:]
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             check=True).stdout
    got = uv_command(uv, pip_settings(listing), args)
    if isinstance(got, str):
        print(f"pip's configuration sets {got}, which uv is not given here: installing with pip", file=sys.stderr)
        return subprocess.run([sys.executable, "-m", "pip", "install", *args]).returncode
    cmd, env = got
    return subprocess.run(cmd, env={**os.environ, **env}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
