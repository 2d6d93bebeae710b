"""vLLM's completion SSE stream -> LMI's `application/jsonlines` token stream.

One JSON object per generated token, each ending in "\\n", nothing else on the wire:

    {"token": {"id": 123, "text": "{", "logprob": -1.06}, "generated_text": null, "details": null}
    ...
    {"token": {...}, "generated_text": "<full text>", "details": {"finish_reason": "length", ...}}

SageMaker's InvokeEndpointWithResponseStream hands the client arbitrary byte slices, so a
client splits on "\\n" and parses each line. The visible text of a chunk goes on its last
token (earlier tokens of the same chunk get ""), so the token texts always concatenate to
`generated_text` even when vLLM holds text back (stop strings, partial UTF-8).
"""
from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from .schema import LMIRequest
from .translate import finish_reason

log = logging.getLogger("vllm.lmi")
MEDIA_TYPE = "application/jsonlines"
_DATA = "data: "
_DONE = "[DONE]"


def _line(doc: dict) -> bytes:
    return (json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


async def jsonlines(req: LMIRequest, sse: AsyncIterator[str]) -> AsyncIterator[bytes]:
    """Translate vLLM's SSE events (strings "data: {...}\\n\\n") into LMI records."""
    prefix = req.inputs if req.parameters.return_full_text else ""
    try:
        async for rec in _records(req, sse, prefix):
            yield rec
    finally:
        # closing vLLM's generator aborts the engine request (client gone, or we failed)
        aclose = getattr(sse, "aclose", None)
        if aclose is not None:
            await aclose()


async def _records(req: LMIRequest, sse: AsyncIterator[str], prefix: str) -> AsyncIterator[bytes]:
    text_parts: list[str] = []
    generated = 0
    carry = ""  # visible text that arrived without a token: goes on the next token
    finished = False
    async for event in sse:
        for raw in event.split("\n"):
            if not raw.startswith(_DATA):
                continue  # blank separators, SSE comments
            payload = raw[len(_DATA):]
            if payload == _DONE:
                continue
            chunk = json.loads(payload)
            if "error" in chunk:  # vLLM reports a failure mid-stream as an error event
                err = chunk["error"]
                msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
                yield _line({"error": msg, "code": (err.get("code") if isinstance(err, dict) else None) or 500})
                finished = True
                continue
            for choice in chunk.get("choices", ()):
                ids = choice.get("token_ids") or []
                lp = choice.get("logprobs") or {}
                logprobs = lp.get("token_logprobs") or [None] * len(ids)
                text = choice.get("text") or ""
                text_parts.append(text)
                if ids:
                    text, carry = carry + text, ""
                else:
                    carry += text
                generated += len(ids)
                reason = choice.get("finish_reason")
                records = [{"token": {"id": tid, "text": text if j == len(ids) - 1 else "",
                                      "logprob": logprobs[j] if j < len(logprobs) else None},
                            "generated_text": None, "details": None} for j, tid in enumerate(ids)]
                if reason is not None:
                    if not records:  # a final event without a token (rare): say so plainly
                        records.append({"token": None, "generated_text": None, "details": None})
                        carry = ""
                    last = records[-1]
                    last["generated_text"] = prefix + "".join(text_parts)
                    last["details"] = {"finish_reason": finish_reason(reason, choice.get("stop_reason")),
                                       "generated_tokens": generated}
                    if req.parameters.seed is not None:
                        last["details"]["seed"] = req.parameters.seed
                    finished = True
                for r in records:
                    yield _line(r)
    if not finished:
        # the engine stopped without a final event (aborted): end with a parseable error record
        yield _line({"error": "generation ended before completion", "code": 500})
