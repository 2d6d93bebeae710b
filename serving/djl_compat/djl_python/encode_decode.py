"""LMI's `decode`, for the model.py files that import it.

LMI's vLLM handler decodes the request itself before the input formatter sees it, so a formatter
never needs this; it is here so that such an import works, and it decodes what it is given the way
LMI does for text requests.
"""
import json


def decode(data, content_type: str = "application/json", key=None):
    """A request body (bytes, str, or an object with get_as_bytes()) as a dict: JSON for a JSON
    content type, else {"inputs": text}."""
    if hasattr(data, "get_as_bytes"):
        data = data.get_as_bytes(key=key) if key is not None else data.get_as_bytes()
    if isinstance(data, (bytes, bytearray)):
        data = data.decode("utf-8")
    if content_type is None or "json" in content_type:
        return json.loads(data)
    return {"inputs": data}
