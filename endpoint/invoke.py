"""Send a request to a SageMaker endpoint serving this image and print the answer's text.

    python -m endpoint.invoke my-llm "What is deep learning?"                  # LMI body
    python -m endpoint.invoke my-llm "What is deep learning?" --stream         # tokens as they arrive
    python -m endpoint.invoke my-llm "Hello" --api chat --max-tokens 64        # OpenAI chat body
    python -m endpoint.invoke my-llm --body '{"inputs": "Hi", "parameters": {"max_new_tokens": 8}}'

Plain requests use InvokeEndpoint; --stream uses InvokeEndpointWithResponseStream and reads
the PayloadPart bytes with endpoint.stream_reader.StreamReader. Exit status: 0 when the answer
is complete, 1 when the endpoint answered an error (before or during the stream), 2 for bad
arguments. Credentials, region and endpoint URL come from boto3 (AWS_ENDPOINT_URL included).
"""
from __future__ import annotations

import argparse
import json
import sys

from .stream_reader import StreamError, StreamReader, payload_parts, token_text


def build_body(args) -> dict:
    """The request body from the arguments; ValueError says what is wrong."""
    if args.body is not None:
        raw = args.body
        if raw.startswith("@"):
            with open(raw[1:], encoding="utf-8") as f:
                raw = f.read()
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"--body is not JSON: {e}") from None
        if not isinstance(body, dict):
            raise ValueError("--body must be a JSON object")
    elif args.prompt is None:
        raise ValueError("give a prompt or --body")
    elif args.api == "lmi":
        params: dict = {"max_new_tokens": args.max_tokens}
        if args.temperature is not None:
            params["temperature"] = args.temperature
            params["do_sample"] = args.temperature > 0
        body = {"inputs": args.prompt, "parameters": params}
    else:
        body = {"max_tokens": args.max_tokens}
        if args.api == "chat":
            body["messages"] = [{"role": "user", "content": args.prompt}]
        else:
            body["prompt"] = args.prompt
        if args.temperature is not None:
            body["temperature"] = args.temperature
    if args.stream:
        body["stream"] = True
    return body


def answer_text(doc) -> str:
    """The generated text of a whole answer: LMI `generated_text` (a list input: one per line), OpenAI choices."""
    if isinstance(doc, list):
        return "\n".join(answer_text(d) for d in doc)
    if "generated_text" in doc:
        return doc["generated_text"]
    parts = []
    for c in doc.get("choices") or ():
        msg = c.get("message")
        parts.append((msg.get("content") if isinstance(msg, dict) else c.get("text")) or "")
    return "".join(parts)


def _client_error(e) -> str:
    r = e.response
    err = r.get("Error", {})
    msg = f"{err.get('Code', 'error')}: {err.get('Message', '')}"
    if r.get("OriginalStatusCode"):  # ModelError: the container's own status and body
        original = r.get("OriginalMessage", "")
        msg += f" (container status {r['OriginalStatusCode']}" + (
            f": {original})" if original and original not in msg else ")")
    return msg


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m endpoint.invoke", description=__doc__.split("\n\n")[0])
    ap.add_argument("endpoint", help="the SageMaker endpoint name")
    ap.add_argument("prompt", nargs="?", help="the prompt (or give --body)")
    ap.add_argument("--api", choices=("lmi", "completion", "chat"), default="lmi",
                    help="body kind built from the prompt: LMI inputs/parameters (default), OpenAI completion or chat")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (default 128)")
    ap.add_argument("--temperature", type=float, help="unset: the body kind's default (LMI: greedy)")
    ap.add_argument("--body", help="the JSON body as is (or @file); --stream adds \"stream\": true")
    ap.add_argument("--stream", action="store_true", help="stream: print tokens as they arrive")
    ap.add_argument("--raw", action="store_true", help="print the answer's JSON (whole, or one record a line)")
    ap.add_argument("--endpoint-url", help="the SageMaker runtime URL (default: boto3's, or AWS_ENDPOINT_URL)")
    return ap


def main(argv: list[str] | None = None, session=None, out=None) -> int:
    """session: a boto3.Session (default: boto3's usual credentials and region); out: where the text goes."""
    out = out or sys.stdout
    ap = parser()
    args = ap.parse_args(argv)
    try:
        body = json.dumps(build_body(args)).encode()
    except (ValueError, OSError) as e:
        ap.error(str(e))

    import boto3
    from botocore.exceptions import ClientError

    client = (session or boto3.Session()).client("sagemaker-runtime", endpoint_url=args.endpoint_url)
    try:
        if not args.stream:
            resp = client.invoke_endpoint(EndpointName=args.endpoint, Body=body, ContentType="application/json",
                                          Accept="application/json")
            doc = json.loads(resp["Body"].read())
            print(json.dumps(doc) if args.raw else answer_text(doc), file=out, flush=True)
            return 0
        resp = client.invoke_endpoint_with_response_stream(EndpointName=args.endpoint, Body=body,
                                                           ContentType="application/json")
        reader = StreamReader()
        try:
            for rec in reader.records(payload_parts(resp["Body"])):
                if args.raw:
                    print(json.dumps(rec), file=out, flush=True)
                else:
                    out.write(token_text(rec))
                    out.flush()
        finally:
            if not args.raw:
                print(file=out, flush=True)
        return 0
    except StreamError as e:
        print(f"error in the stream: {e}", file=sys.stderr)
        return 1
    except ClientError as e:
        print(f"endpoint error: {_client_error(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
