"""LMI's input and output formatters from the user's model.py, applied as LMI's vLLM handler applies them.

- The script in the code folder (model.py, or CUSTOM_SCRIPT_FILENAME) serves every request; the
  model.py of `adapters/<name>/` serves the requests for that adapter (the script's formatter where it
  has none of its own).
- A function marked `@input_formatter` (djl_python.input_parser) gets the request's decoded JSON
  object, with the keyword arguments `tokenizer` and `adapter_name`, and returns the object served
  instead: a body with `inputs`, `prompt` or `messages`, which then goes through the usual LMI or
  OpenAI handling.
- A function marked `@output_formatter` (djl_python.output_formatter) gets vLLM's answer object (a
  CompletionResponse or ChatCompletionResponse, or each chunk of a stream as vLLM's handler yields
  it, a `data: {...}` event string) and its return value is the body: str or bytes as is, a pydantic
  model or anything else as JSON.
- A formatter that raises, or returns something it may not, gets 424 naming the function.

The scripts are loaded through model-hosting-container-standards' function loader, the one vLLM's
SageMaker routes load them with, so the script is imported once in the engine.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..custom_code import adapter_scripts, one_line
from .errors import LMIError

log = logging.getLogger("vllm.lmi")

@dataclass(frozen=True)
class Formatters:
    input: Callable | None = None
    output: Callable | None = None
    script: str = ""

    def __bool__(self) -> bool:
        return self.input is not None or self.output is not None


def _marked(module, attribute: str) -> Callable | None:
    """The module's function carrying LMI's marker attribute (what LMI's loader looks for)."""
    for obj in vars(module).values():
        if callable(obj) and getattr(obj, attribute, False) is True:
            return obj
    return None


def _from_module(module, script: Path) -> Formatters:
    return Formatters(_marked(module, "is_input_formatter"), _marked(module, "is_output_formatter"), str(script))


def load(env=os.environ) -> dict[str | None, Formatters]:
    """{None: the script's formatters, adapter name: its own} for those that have any."""
    from model_hosting_container_standards.common.custom_code_ref_resolver.function_loader import FunctionLoader
    from model_hosting_container_standards.sagemaker.sagemaker_loader import SageMakerFunctionLoader

    folder = Path(env.get("SAGEMAKER_MODEL_PATH", "") or "/opt/ml/model")
    out: dict[str | None, Formatters] = {}
    script = folder / SageMakerFunctionLoader.get_custom_script_filename()
    if script.is_file():
        # the loader mhcs itself uses (cached): the module its routes see
        f = _from_module(SageMakerFunctionLoader.get_function_loader().load_module_from_file(str(script)), script)
        if f:
            out[None] = f
    for path in adapter_scripts(folder):
        f = _from_module(FunctionLoader([str(path.parent)]).load_module_from_file(str(path)), path)
        if f:
            out[path.parent.name] = f
    for name, f in out.items():
        log.info("LMI formatters of %s (%s): input %s, output %s", "the model" if name is None else f"adapter {name}",
                 f.script, _name(f.input), _name(f.output))
    return out


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or "none"


def pick(all_formatters: dict[str | None, Formatters], adapter: str | None) -> Formatters:
    base = all_formatters.get(None, Formatters())
    own = all_formatters.get(adapter) if adapter else None
    if own is None:
        return base
    return Formatters(own.input or base.input, own.output or base.output, own.script)


def apply_input(f: Formatters, doc: Any, tokenizer, adapter: str | None) -> dict:
    fn = f.input
    try:
        out = fn(doc, tokenizer=tokenizer, adapter_name=adapter)
    except Exception as e:  # the user's code may raise anything
        log.warning("input formatter %s failed", _name(fn), exc_info=True)
        raise LMIError(f"body: the input formatter {_name(fn)} ({f.script}) raised {one_line(e)}", "body") from None
    if not isinstance(out, dict):
        raise LMIError(f"body: the input formatter {_name(fn)} ({f.script}) returned {type(out).__name__}; it must "
                       "return a dict with inputs, prompt or messages", "body")
    return out


def apply_output(f: Formatters, answer: Any) -> bytes:
    fn = f.output
    try:
        out = fn(answer)
    except Exception as e:  # the user's code may raise anything
        log.warning("output formatter %s failed", _name(fn), exc_info=True)
        raise LMIError(f"the output formatter {_name(fn)} ({f.script}) raised {one_line(e)}") from None
    return to_bytes(out, fn, f.script)


def to_bytes(out: Any, fn, script: str) -> bytes:
    if isinstance(out, bytes):
        return out
    if isinstance(out, str):
        return out.encode()
    if hasattr(out, "model_dump_json"):
        return out.model_dump_json().encode()
    try:
        return json.dumps(out, ensure_ascii=False).encode()
    except (TypeError, ValueError):
        raise LMIError(f"the output formatter {_name(fn)} ({script}) returned {type(out).__name__}, which is not "
                       "str, bytes or JSON") from None
