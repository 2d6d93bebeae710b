"""Settings vLLM validates only at server start or after loading the weights, checked at plan time against vLLM's
own registries and checks, so a bad value stops the start at once with one line naming the key.

vLLM's parser takes any string for these; `vllm serve` then fails late: a tool-call or reasoning parser name in
validate_api_server_args or the chat handler (a KeyError traceback), the speculative method when it builds the
engine config, a LoRA module folder after the weights are loaded. The checks here use the same registries vLLM uses
(ToolParserManager, ReasoningParserManager, QUANTIZATION_METHODS, SpeculativeMethod, AttentionBackendEnum) and run
vLLM's own validate_parsed_serve_args on the whole command. A parser plugin (tool_parser_plugin,
reasoning_parser_plugin) may register more names at start: with one set, that parser's name is left to vLLM.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import typing
from pathlib import Path
from typing import Iterable, Mapping

from . import resolve

LOCAL_PREFIXES = ("/", "./", "../", "~")  # a value that names a folder on this machine, as the launcher reads it


def literal_values(tp) -> list[str]:
    """Every string a (nested) typing.Literal admits."""
    out = []
    for a in typing.get_args(tp):
        out += literal_values(a) if typing.get_args(a) else [a] if isinstance(a, str) else []
    return out


def _allowed(names: Iterable[str]) -> str:
    return ", ".join(sorted(names))


def check(entries: Mapping[str, resolve.Resolved], serve_args: list[str], parser: argparse.ArgumentParser) -> None:
    """Raise ConfigError for the first setting vLLM would refuse late. serve_args: the engine command's flags (after
    `serve MODEL`), parsed with vLLM's own parser."""
    by_flag = {r.flag: r for r in entries.values() if r.flag}
    ns = _parse(parser, serve_args)
    if ns is not None:
        _vllm_serve_checks(ns, by_flag)
    _local_paths(by_flag)
    _parsers(by_flag)
    _chat_template(by_flag.get("--chat-template"))
    _speculative(by_flag.get("--speculative-config"))
    _lora_modules(by_flag.get("--lora-modules"), ns)
    _choice(by_flag.get("--quantization"), "vLLM's quantization methods", _quantization_methods)
    _choice(by_flag.get("--attention-backend"), "vLLM's attention backends", _attention_backends,
            normalize=lambda v: "auto" if v.lower() == "auto" else v.upper())


def _parse(parser: argparse.ArgumentParser, serve_args: list[str]) -> argparse.Namespace | None:
    try:
        return parser.parse_args(serve_args)
    except Exception:  # each flag was checked on its own; a combination vLLM's parser refuses is its to report
        return None


def _error(r: resolve.Resolved, message: str) -> resolve.ConfigError:
    return resolve.ConfigError(r.key, r.source, message)


def _vllm_serve_checks(ns: argparse.Namespace, by_flag: Mapping[str, resolve.Resolved]) -> None:
    """vLLM's validate_parsed_serve_args, which `vllm serve` runs after the launcher; its message names flags: the
    first one the user set names the key."""
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    try:
        validate_parsed_serve_args(ns)
    except Exception as e:
        message = " ".join(str(e).split()).removeprefix("Error: ")
        named = [f for f in re.findall(r"--[a-z0-9][a-z0-9-]*", message) if f in by_flag]
        r = by_flag[named[0]] if named else by_flag.get("--chat-template")
        if r is None:
            raise resolve.ConfigError("vLLM arguments", "the engine command", message) from None
        raise _error(r, message) from None


# Flags whose value is a hub id or a path on this machine; vLLM reads a missing local one only once the engine is
# built (tokenizer, generation config) or imports a missing plugin file with a logged error and goes on without it.
LOCAL_PATH_FLAGS = {"--tokenizer": "folder", "--generation-config": "folder", "--tool-parser-plugin": "file",
                    "--reasoning-parser-plugin": "file"}
GENERATION_CONFIG_WORDS = ("auto", "vllm")


def _local_paths(by_flag: Mapping[str, resolve.Resolved]) -> None:
    for flag, kind in LOCAL_PATH_FLAGS.items():
        r = by_flag.get(flag)
        value = r.raw.strip() if r is not None else ""
        if not value or value in GENERATION_CONFIG_WORDS and flag == "--generation-config":
            continue
        path = Path(value).expanduser()
        local = value.startswith(LOCAL_PREFIXES) or kind == "file" and value.endswith(".py")
        if local and not (path.is_dir() if kind == "folder" else path.is_file()):
            raise _error(r, f"{kind} {value} does not exist")


def _parsers(by_flag: Mapping[str, resolve.Resolved]) -> None:
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    for flag, plugin, manager, what in (
            ("--tool-call-parser", "--tool-parser-plugin", ToolParserManager, "tool-call parser"),
            ("--reasoning-parser", "--reasoning-parser-plugin", ReasoningParserManager, "reasoning parser")):
        r = by_flag.get(flag)
        if r is None or not r.raw.strip() or (by_flag.get(plugin) and by_flag[plugin].raw.strip()):
            continue
        names = manager.list_registered()
        if r.raw.strip() not in names:
            raise _error(r, f"{r.raw.strip()!r} is not a {what} of vLLM (allowed: {_allowed(names)}; or a name "
                            f"that option.{plugin[2:].replace('-', '_')} registers)")


def _chat_template(r: resolve.Resolved | None) -> None:
    """An existing path must be a readable file, and an inline template (vLLM's rule: a value with braces or a
    newline) must parse; a missing path is vLLM's validate_chat_template's to name (above)."""
    if r is None or not r.raw.strip():
        return
    value = r.raw.strip()
    if any(c in value for c in "{}\n"):
        import jinja2
        try:
            jinja2.Environment().parse(value)
        except jinja2.TemplateSyntaxError as e:
            raise _error(r, f"inline chat template does not parse as Jinja: {e.message} (line {e.lineno})") from None
        return
    path = Path(value).expanduser()
    if path.exists() and (not path.is_file() or not os.access(path, os.R_OK)):
        raise _error(r, f"{value} is not a readable file")


def speculative_methods() -> list[str]:
    from vllm.config.speculative import SpeculativeMethod
    return literal_values(SpeculativeMethod) + ["[ngram]"]  # vLLM reads the bracketed form as ngram


def _speculative(r: resolve.Resolved | None) -> None:
    if r is None:
        return
    try:
        config = json.loads(r.raw)
    except ValueError:
        return  # vLLM's parser named it already
    method = config.get("method") if isinstance(config, dict) else None
    if method is not None and method not in (names := speculative_methods()):
        raise _error(r, f"method {method!r} is not a speculative decoding method of vLLM (allowed: "
                        f"{_allowed(names)}; or leave method out to infer it from the draft model)")


def _lora_modules(r: resolve.Resolved | None, ns: argparse.Namespace | None) -> None:
    """A LoRA module path that names a folder on this machine must be an adapter folder; a hub id is vLLM's to
    download."""
    if r is None or ns is None:
        return
    for module in getattr(ns, "lora_modules", None) or []:
        raw = str(module.path)
        path = Path(raw).expanduser()
        if not path.exists():
            if raw.startswith(LOCAL_PREFIXES):
                raise _error(r, f"LoRA module {module.name}: folder {raw} does not exist")
            continue
        if not (path / "adapter_config.json").is_file():
            raise _error(r, f"LoRA module {module.name}: {raw} holds no adapter_config.json (not a LoRA adapter)")


def _quantization_methods() -> list[str]:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    return list(QUANTIZATION_METHODS)


def _attention_backends() -> list[str]:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    return ["auto", *AttentionBackendEnum.__members__]


def _choice(r: resolve.Resolved | None, what: str, names, normalize=lambda v: v) -> None:
    if r is None or not r.raw.strip():
        return
    allowed = names()
    if normalize(r.raw.strip()) not in allowed:
        raise _error(r, f"{r.raw.strip()!r} is not one of {what} (allowed: {_allowed(allowed)})")

