"""Error answers on /invocations.

LMI clients expect LMI's shape `{"error": "<message>", "code": 424}` with HTTP 424 for any
request it cannot serve; we keep that and add `field` (the JSON path at fault) so a
person can see what to fix without guessing. Errors raised before the body kind is known
(body too large, body not JSON) use the same flat shape with a plain 4xx status.
"""
from __future__ import annotations

import json

LMI_STATUS = 424  # what LMI (DJL serving) answers for a request it rejects


class LMIError(Exception):
    """A request we refuse; the message says which field and what is allowed."""

    def __init__(self, message: str, field: str | None = None, status: int = LMI_STATUS):
        super().__init__(message)
        self.message = message
        self.field = field
        self.status = status

    def body(self) -> bytes:
        doc: dict = {"error": self.message, "code": self.status}
        if self.field:
            doc["field"] = self.field
        return json.dumps(doc).encode()


async def send_json(send, status: int, body: bytes, extra_headers: list | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(extra_headers or [])]})
    await send({"type": "http.response.body", "body": body})


async def send_error(send, err: LMIError) -> None:
    await send_json(send, err.status, err.body())
