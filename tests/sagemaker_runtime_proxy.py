"""A loopback stand-in for SageMaker's runtime API in front of the project's own server.

boto3's sagemaker-runtime client, pointed here with endpoint_url, sends its real requests:
  POST /endpoints/<name>/invocations                  -> the body is forwarded to <server>/invocations
  POST /endpoints/<name>/invocations-response-stream  -> the same, and the answer's bytes come back
       as an AWS event stream of PayloadPart events, cut at the sizes in `cuts` (cycled), so
       lines are split across parts and parts hold several lines, as SageMaker's transport does.
A container answer other than 2xx becomes SageMaker's ModelError (HTTP 424, the container's
status and body in OriginalStatusCode / OriginalMessage). `fail_after` ends a stream with a
ModelStreamError exception event after that many bytes, as SageMaker reports a container that
fails mid-stream. What this does not emulate: authentication, SageMaker's own limits and timeouts.
"""
from __future__ import annotations

import binascii
import http.client
import json
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import cycle
from urllib.parse import urlsplit


def _headers(headers: dict[str, str]) -> bytes:
    out = b""
    for name, value in headers.items():
        n, v = name.encode(), value.encode()
        out += struct.pack("!B", len(n)) + n + struct.pack("!BH", 7, len(v)) + v  # 7: string value
    return out


def event_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One message of the AWS event stream encoding (prelude, prelude CRC, headers, payload, message CRC)."""
    h = _headers(headers)
    prelude = struct.pack("!II", 12 + len(h) + len(payload) + 4, len(h))
    head = prelude + struct.pack("!I", binascii.crc32(prelude))
    body = head + h + payload
    return body + struct.pack("!I", binascii.crc32(body))


def payload_part(data: bytes) -> bytes:
    return event_message({":event-type": "PayloadPart", ":content-type": "application/octet-stream",
                          ":message-type": "event"}, data)


def model_stream_error(message: str) -> bytes:
    return event_message({":exception-type": "ModelStreamError", ":content-type": "application/json",
                          ":message-type": "exception"},
                         json.dumps({"Message": message, "ErrorCode": "ModelStreamError"}).encode())


class RuntimeProxy:
    def __init__(self, upstream: str, cuts: tuple[int, ...] = (7, 300)):
        self.upstream = urlsplit(upstream)
        self.cuts = cuts
        self.fail_after: int | None = None
        self.parts: list[bytes] = []  # the payload parts of the last stream
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                stream = self.path.endswith("/invocations-response-stream")
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=300)
                try:
                    conn.request("POST", "/invocations", body, {"Content-Type": self.headers["Content-Type"]})
                    up = conn.getresponse()
                    if up.status >= 300:
                        return self._model_error(up.status, up.read())
                    if stream:
                        return self._stream(up)
                    data = up.read()
                    self.send_response(200)
                    self.send_header("Content-Type", up.getheader("Content-Type", "application/json"))
                    self.send_header("x-Amzn-Invoked-Production-Variant", "AllTraffic")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    conn.close()

            def _model_error(self, status: int, data: bytes):
                text = data.decode(errors="replace")
                doc = json.dumps({"ErrorCode": "CLIENT_ERROR_FROM_MODEL", "OriginalStatusCode": status,
                                  "OriginalMessage": text,
                                  "Message": f"Received client error ({status}) from primary with message \"{text}\""})
                self.send_response(424)
                self.send_header("x-amzn-ErrorType", "ModelError")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(doc)))
                self.end_headers()
                self.wfile.write(doc.encode())

            def _stream(self, up):
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.amazon.eventstream")
                self.send_header("X-Amzn-SageMaker-Content-Type", up.getheader("Content-Type", ""))
                self.end_headers()  # no length: the body ends when the connection closes
                sizes, pending, sent = cycle(proxy.cuts), b"", 0
                proxy.parts = []
                size = next(sizes)
                while True:
                    chunk = up.read1(65536)
                    pending += chunk
                    while len(pending) >= size or (not chunk and pending):
                        if proxy.fail_after is not None and sent >= proxy.fail_after:
                            self.wfile.write(model_stream_error("Model container failed while streaming"))
                            return
                        part, pending = pending[:size], pending[size:]
                        self.wfile.write(payload_part(part))
                        self.wfile.flush()
                        proxy.parts.append(part)
                        sent += len(part)
                        size = next(sizes)
                    if not chunk:
                        return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "RuntimeProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
