"""What a setting is (`Setting`, one row of the settings table in serving/settings.py) and the one rule that
decides between two values of it (`rank`).

A setting's names are derived from its row: `option.<key>` and `option.<alias>` in serving.properties,
`OPTION_<KEY>` and `OPTION_<ALIAS>` in the environment, `SM_VLLM_<FLAG>` for its vLLM flag, and the other
conventions' names it lists in `env`.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass
from enum import IntEnum
from typing import Callable

from .settings_parsers import Context, parse_str


@dataclass(frozen=True)
class Setting:
    key: str
    help: str                          # one or two sentences: what it does, when to change it
    parse: Callable[[str], object] = parse_str
    default: object = None
    flag: str | None = None            # vLLM OpenAI-server flag; None: the launcher uses it itself
    aliases: tuple[str, ...] = ()      # other option keys (LMI names) for the same setting
    env: tuple[str, ...] = ()          # environment names of other conventions (TGI/HF), weakest first
    secret: bool = False               # never printed
    engine_env: str | None = None      # handed to the engine in this environment variable (secrets: never argv,
                                       # which /proc, ps and vLLM's own "non-default args" log line would show)
    example: str = ""
    default_text: str = ""             # the default as the reference shows it, where the value depends on the machine
    # A place the container finds things in (model folder, cache, Python): read from its environment
    # names only (serving.properties lives in one of them), and shown by the report's model and env
    # lines rather than as a setting line.
    location: bool = False
    # Turns a parsed value that depends on the machine (tensor_parallel_size=max) into the value used.
    contextual: Callable[[object, Context], object] | None = None
    # Accepted from LMI/TGI/SageMaker but nothing to do here: why, logged once at start.
    no_effect: str = ""
    # The only values this container can honour (compared lower-case); any other stops the start
    # with `instead` saying what to use.
    choices: tuple[str, ...] = ()
    instead: str = ""
    top_level: bool = False  # serving.properties writes it without "option." (LMI's model-server keys)
    reader: str = ""  # who reads it where not the launcher alone (the reference's flag column)
    # Why the default is what it is: the reasons and measurements, shown in docs/settings.md only (not in
    # --list-settings or --help).
    why: str = ""

    @property
    def option_keys(self) -> tuple[str, ...]:
        return () if self.location else (self.key, *self.aliases)

    @property
    def env_names(self) -> tuple[str, ...]:
        """Every environment name, strongest first (the order `rank` gives them)."""
        names = [f"OPTION_{k.upper()}" for k in self.option_keys]
        if self.flag and not self.location:
            names.append(sm_vllm_name(self.flag))
        names.extend(self.env)
        names = list(dict.fromkeys(names))
        return tuple(sorted(names, key=lambda n: rank(Level.ENV, self, n), reverse=True))


def value_type(s: Setting) -> object:
    """The type of a setting's effective value: what its parser returns, or None too where it has no default."""
    hint = typing.get_type_hints(s.parse).get("return", object)
    return hint if s.default is not None else hint | None


class Level(IntEnum):
    """Where a value came from, weakest first."""
    DEFAULT = 0   # the table's default
    CONTEXT = 1   # a default that depends on the build or the model (CPU KV cache, the tiny model's context)
    FILE = 2      # serving.properties
    ENV = 3       # the environment


def rank(level: Level, setting: Setting | None, name: str) -> tuple[int, int, int]:
    """The one precedence rule: the candidate with the higher rank wins.

    Sources are ordered by `level`. Within one source the name used decides: the canonical key
    (`option.<key>`, `OPTION_<KEY>`) beats an alias or vLLM's name of the setting, which beats
    `SM_VLLM_<FLAG>`, which beats the other conventions' names (later in `Setting.env`: stronger).
    `name` is the environment name for ENV, the option key otherwise; `setting` is None for a
    vLLM pass-through key.
    """
    if level is not Level.ENV:
        key = name.replace("-", "_").lower()
        return (level, 3 if setting is not None and key == setting.key else 2, 0)
    if setting is not None and name in setting.env:
        return (level, 0, setting.env.index(name))
    if name.startswith("SM_VLLM_"):
        return (level, 1, 0)
    key = name.removeprefix("OPTION_").lower()
    if setting is not None and key in setting.aliases:
        return (level, 2, -setting.aliases.index(key))
    return (level, 3 if setting is not None and key == setting.key else 2, 0)


def sm_vllm_name(flag: str) -> str:
    """vLLM SageMaker image convention: SM_VLLM_MAX_MODEL_LEN=... -> --max-model-len ..."""
    return "SM_VLLM_" + flag.lstrip("-").replace("-", "_").upper()
