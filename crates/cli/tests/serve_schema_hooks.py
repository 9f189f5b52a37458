"""Schemathesis hooks for serve_schema.rs: keep generation short.

Schemathesis draws token limits anywhere in their schema's range (up to 2^64); a request that
asks for a million tokens is valid and snug honours it until the context is full, which is
slow on a CPU. So every generated limit above 4 (or absent) becomes 4; 0 and other values
the server must refuse stay as drawn.
"""

import schemathesis

CAP = 4


def capped(n):
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= CAP else CAP


def keep_if_invalid(v):
    """A value of the wrong type stays (the server must refuse it); a number is capped."""
    return capped(v) if v is None or isinstance(v, int) and not isinstance(v, bool) else v


@schemathesis.hook
def map_body(context, body):
    if not isinstance(body, dict):
        return body
    path = context.operation.path if context.operation else ""
    if path.startswith("/v1/"):
        for field in ("max_tokens", "max_completion_tokens"):
            body[field] = keep_if_invalid(body.get(field))
    elif path in ("/api/chat", "/api/generate"):
        options = body.get("options")
        if options is None:
            options = body["options"] = {}
        if isinstance(options, dict):
            options["num_predict"] = keep_if_invalid(options.get("num_predict"))
    return body
