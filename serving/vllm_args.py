"""The installed vLLM's own OpenAI-server argument parser (`vllm serve`'s), used to type pass-through settings.

A key that is not declared in `settings.py` is accepted when it names an
argument of vLLM's server; its value becomes argv the way vLLM parses it
(booleans both ways, lists, JSON, choices), and is checked with vLLM's parser
itself, so an error names the key before the engine starts loading.
"""
from __future__ import annotations

import argparse
import functools
import json

from .settings import SettingValueError, parse_bool

# The launcher sets these itself; a user value would break the contract of the container.
# (model_tag: use model_id; config: settings come from serving.properties and the environment.)
RESERVED = {"model_tag", "config", "help"}


# True once the parser was made as the CPU platform for want of a device: this process's vLLM then
# cannot run the engine, which needs a fresh interpreter.
parsed_without_device = False


class _ParseError(Exception):
    pass


@functools.cache  # one parser per process: every plan() of a process types its settings with the same one
def _raising_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):
        def error(self, message):  # argparse would print usage and exit
            raise _ParseError(message)

    try:
        return make_arg_parser(Parser(description="vLLM OpenAI server", add_help=False))
    except RuntimeError as e:
        if "infer device type" not in str(e):
            raise
    # The GPU build of vLLM on a host without a GPU (a dry run on a laptop or in CI) cannot infer
    # its device, and the parser's defaults ask for one; the arguments themselves do not depend on
    # it. This process only parses (the engine runs in the process that replaces it), so parse as
    # the CPU platform.
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    global parsed_without_device
    parsed_without_device = True
    vllm.platforms.current_platform = CpuPlatform()
    return make_arg_parser(Parser(description="vLLM OpenAI server", add_help=False))


class VllmArgs:
    def __init__(self, parser: argparse.ArgumentParser | None = None):
        self.parser = parser or _raising_parser()
        self.by_dest: dict[str, argparse.Action] = {}
        self.by_name: dict[str, argparse.Action] = {}
        for a in self.parser._actions:
            if not a.option_strings or a.dest in RESERVED:
                continue
            self.by_dest.setdefault(a.dest, a)
            for o in a.option_strings:
                if o.startswith("--"):
                    self.by_name.setdefault(o[2:].replace("-", "_"), a)

    def keys(self) -> list[str]:
        return sorted(set(self.by_name))

    def _action(self, key: str) -> argparse.Action | None:
        k = key.replace("-", "_").lower()
        return self.by_name.get(k) or self.by_dest.get(k)

    def flag_for(self, key: str) -> str | None:
        a = self._action(key)
        return None if a is None else _long(a)

    def argv(self, flag: str, raw: str) -> list[str]:
        """Argv for one setting, typed as vLLM's parser expects; raises SettingValueError."""
        a = self._action(flag.lstrip("-"))
        if a is None:
            raise SettingValueError(f"{flag} is not an argument of the installed vLLM")
        if a.nargs == 0:  # a switch: store_true or --x/--no-x
            on = parse_bool(raw)
            if on:
                return [_long(a)]
            if isinstance(a, argparse.BooleanOptionalAction):
                return ["--no-" + _long(a)[2:]]
            return []  # store_true switched off: absent is off
        if a.nargs in ("+", "*") or isinstance(a.nargs, int):
            items = _list_items(raw)
            frag = [_long(a), *items]
        else:
            frag = [_long(a), raw]
        self.check(frag)
        return frag

    def check(self, argv: list[str]) -> None:
        try:
            self.parser.parse_args(argv)
        except _ParseError as e:
            raise SettingValueError(_plain(str(e), self._action(argv[0].lstrip("-")))) from None
        except (ValueError, TypeError) as e:  # some vLLM types raise instead of calling error()
            raise SettingValueError(_plain(str(e), None)) from None


def _long(a: argparse.Action) -> str:
    return next(o for o in a.option_strings if o.startswith("--"))


def _list_items(raw: str) -> list[str]:
    s = raw.strip()
    if s.startswith("["):
        try:
            items = json.loads(s)
        except json.JSONDecodeError as e:
            raise SettingValueError(f"{raw!r} is not a JSON list: {e}") from None
        return [i if isinstance(i, str) else json.dumps(i) for i in items]
    return s.split()


def _plain(message: str, action: argparse.Action | None) -> str:
    """argparse's message on one line (pydantic's are several), plus the allowed choices."""
    lines = [l.strip() for l in message.splitlines() if l.strip() and "errors.pydantic.dev" not in l]
    message = " ".join(lines)
    if action is not None and action.choices and "choice" not in message:
        return f"{message} (allowed: {', '.join(map(str, action.choices))})"
    return message
