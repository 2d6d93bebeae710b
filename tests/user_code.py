"""Model folders holding users' own code, for the tests that serve it (no pytest here).

- `make_wheel`: a small pure-Python wheel, written as the wheel format says (a zip with the package,
  METADATA, WHEEL and a RECORD of hashes), so pip installs it from a local folder without network.
- `model_folder`: the embedded tiny model copied into a folder, with the files given beside it.
"""
from __future__ import annotations

import base64
import hashlib
import shutil
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THIRD_PARTY = ROOT / "tests" / "third_party"

WHEEL_NAME = "lmi_fixture_greeting"
WHEEL_VERSION = "1.0.0"
WHEEL_TAG = f"{WHEEL_NAME}-{WHEEL_VERSION}"
# The package: a constant and a /ping handler (CUSTOM_FASTAPI_PING_HANDLER=lmi_fixture_greeting:ping).
WHEEL_SOURCE = f'''"""A package installed from requirements.txt in the tests."""
import json

from fastapi import Request, Response

TAG = "{WHEEL_TAG}"


async def ping(request: Request) -> Response:
    return Response(content=json.dumps({{"status": "healthy", "handler": "lmi_fixture_greeting.ping"}}),
                    media_type="application/json")
'''


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(folder: Path, version: str = WHEEL_VERSION) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{WHEEL_NAME}-{version}.dist-info"
    files = {
        f"{WHEEL_NAME}/__init__.py": WHEEL_SOURCE.replace(WHEEL_VERSION, version).encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {WHEEL_NAME.replace('_', '-')}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests/user_code.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "\n".join([_record_line(n, d) for n, d in files.items()] + [f"{dist}/RECORD,,"]) + "\n"
    path = folder / f"{WHEEL_NAME}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{dist}/RECORD", record)
    return path


def model_folder(dest: Path, files: dict[str, str | Path]) -> Path:
    """The embedded tiny model in `dest`, plus `files` ({relative name: text, or a file to copy})."""
    from serving.tiny_model import default_model_dir, ensure

    shutil.copytree(ensure(default_model_dir()), dest)
    for name, content in files.items():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copy(content, target)
        else:
            target.write_text(content)
    return dest


# model.py of the LMI model folder the tests serve: LMI's two documented formatter examples are files
# beside it, imported unmodified; the output formatter is the tests' own (LMI's documented output example
# is written for its rolling-batch handlers and carries no @output_formatter mark, so LMI's vLLM handler,
# like this container, does not call it).
LMI_MODEL_PY = '''"""model.py of the tests' LMI model folder."""
import json

from djl_python.output_formatter import output_formatter

import lmi_fixture_greeting
from input_formatter_example import custom_input_formatter  # noqa: F401  (LMI's documented example)
from output_formatter_example import custom_output_formatter  # noqa: F401  (LMI's documented example)


@output_formatter
def tagged_output(response):
    """vLLM's answer object -> the body. Raises for an answer of exactly 3 tokens (the tests' failing case)."""
    if isinstance(response, str):  # a streamed chunk, as vLLM's handler yields it
        return json.dumps({"chunk": response.strip(), "wheel": lmi_fixture_greeting.TAG}) + "\\n"
    if response.usage.completion_tokens == 3:
        raise ValueError("three tokens are not accepted")
    first = response.choices[0]
    text = first.message.content if hasattr(first, "message") else first.text
    return {"type": type(response).__name__, "text": text, "tokens": response.usage.completion_tokens,
            "wheel": lmi_fixture_greeting.TAG}
'''


def lmi_model_folder(dest: Path) -> Path:
    """The tiny model with LMI-style user code: model.py, LMI's documented formatter examples, and a
    requirements.txt whose package comes from the wheel folder beside it (no index)."""
    docs = THIRD_PARTY / "djl_serving_docs"
    mdir = model_folder(dest, {
        "model.py": LMI_MODEL_PY,
        "input_formatter_example.py": docs / "input_formatter_example.py",
        "output_formatter_example.py": docs / "output_formatter_example.py",
        "requirements.txt": f"{WHEEL_NAME.replace('_', '-')}=={WHEEL_VERSION}\n",
    })
    make_wheel(mdir / "requirements")
    return mdir
