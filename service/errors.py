"""Typed errors of the embeddings service, one class per HTTP status, and the body parser.

Every error carries plain data only (status, code, message, request id, attempt counts):
never the requests Response/PreparedRequest, which hold the Authorization header. Errors
pickle and unpickle with their attributes, so they can cross process boundaries.
"""
from __future__ import annotations

import json
import re
from typing import Any
from collections.abc import Mapping

_MAX_MESSAGE_CHARS = 500
# OpenAI's wording, also used by the sandbox for an over-length input.
_CONTEXT_RE = re.compile(
    r"maximum context length is (\d+) tokens?, however you requested (\d+) tokens?", re.IGNORECASE)


class EmbeddingsError(Exception):
    """Base class. `attempts`/`uncertain_attempts`/`timed_out_attempts`/`latency_ms` are filled
    in by the client's retry loop: uncertain attempts failed after the request was sent, so they
    may be billed; timed-out ones (read timeouts) are among them."""

    default_retryable = False

    def __init__(self, message: str, *, status: int | None = None, code: Any = None,
                 request_id: str | None = None, attempts: int = 1, retryable: bool | None = None,
                 error_type: str | None = None, uncertain_attempts: int = 0,
                 latency_ms: float | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.error_type = error_type
        self.request_id = request_id
        self.attempts = attempts
        self.uncertain_attempts = uncertain_attempts
        self.timed_out_attempts = 0
        self.latency_ms = latency_ms
        self.retryable = self.default_retryable if retryable is None else retryable

    def __str__(self) -> str:
        extra = [f"request_id={self.request_id}"] if self.request_id else []
        if self.attempts != 1:
            extra.append(f"attempts={self.attempts}")
        return f"{self.message} [{', '.join(extra)}]" if extra else self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # The keyword-only constructor would not survive the default Exception pickling.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[EmbeddingsError], args: tuple[Any, ...], state: dict[str, Any]) -> EmbeddingsError:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class APIConnectionError(EmbeddingsError):
    """No HTTP answer: connection refused or reset. Retried."""
    default_retryable = True


class APITimeoutError(APIConnectionError):
    """Connect or read timeout. A read timeout happens after sending: it may be billed."""


class APIStatusError(EmbeddingsError):
    """An HTTP error status; the subclasses name the statuses a caller acts on."""


class BadRequestError(APIStatusError):
    """400: unknown model, malformed or over-length input. Never retried as is."""


class ContextLengthExceededError(BadRequestError):
    """400 for an input over the model's limit; split it further. Numbers are None when
    the service gave the code but not OpenAI's wording."""

    def __init__(self, message: str, *, max_tokens: int | None = None,
                 requested_tokens: int | None = None, **kw: Any):
        super().__init__(message, **kw)
        self.max_tokens = max_tokens
        self.requested_tokens = requested_tokens


class AuthenticationError(APIStatusError):
    """401: missing, invalid or deleted key. Stop the run."""


class InsufficientBalanceError(APIStatusError):
    """402: not enough balance (possibly by the service's pre-estimate). Stop spending."""


class PermissionDeniedError(APIStatusError):
    """403: model or source address not allowed for this key."""


class NotFoundError(APIStatusError):
    """404: wrong base URL or account segment."""


class RequestTooLargeError(APIStatusError):
    """413: the request body is over the service's size limit; send fewer inputs."""


class RateLimitError(APIStatusError):
    """429; `retry_after` in seconds when the service said so."""
    default_retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any):
        super().__init__(message, **kw)
        self.retry_after = retry_after


class InternalServerError(APIStatusError):
    """5xx. Retried; the attempt may have been billed."""
    default_retryable = True


class InvalidResponseError(EmbeddingsError):
    """A 2xx whose body is not what the spec says (wrong count, ragged vectors, not JSON).
    Not retried: the request was probably billed. `usage` is kept when it could be parsed.
    `base64_ignored`: this request asked for base64 and its vectors were not float32 arrays
    (a server that ignores the field): worth sending again as float, whatever the client asks
    for by then."""

    def __init__(self, message: str, *, usage: Any = None, base64_ignored: bool = False, **kw: Any):
        super().__init__(message, **kw)
        self.usage = usage
        self.base64_ignored = base64_ignored


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError, 401: AuthenticationError, 402: InsufficientBalanceError,
    403: PermissionDeniedError, 404: NotFoundError, 413: RequestTooLargeError,
    429: RateLimitError,
}
# 408 request timeout and 409 conflict/lock timeout are transient (OpenAI's SDK retries them too).
_RETRYABLE_STATUSES = frozenset({408, 409, 429})


def is_retryable_status(status: int) -> bool:
    return status in _RETRYABLE_STATUSES or status >= 500


def redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "[REDACTED]") if secret else text


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + "..."


def parse_error_body(status: int, body: bytes, content_type: str | None
                     ) -> tuple[str, Any, str | None]:
    """(message, code, type) from either error shape; a readable stand-in for anything else.

    Shapes: {"error": {"code", "message", "type"?, "metadata"?}} (the service and OpenAI),
    {"error": "text"}, {"message": ...} / {"detail": ...}. An HTML or empty body is described,
    never quoted."""
    ctype = (content_type or "unknown type").split(";")[0].strip()
    if not body.strip():
        return f"HTTP {status} with an empty body", None, None
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return f"HTTP {status} with a non-JSON body ({ctype}, {len(body)} bytes)", None, None
    err = doc.get("error", doc) if isinstance(doc, Mapping) else None
    if isinstance(err, str):
        return _one_line(err), None, None
    if not isinstance(err, Mapping):
        return f"HTTP {status} with an unexpected JSON body ({type(doc).__name__})", None, None
    message = err.get("message") or err.get("detail")
    code, etype = err.get("code"), err.get("type")
    if not isinstance(message, str) or not message.strip():
        message = f"HTTP {status} (no message)"
    return _one_line(message), code, etype if isinstance(etype, str) else None


def error_from_response(status: int, headers: Mapping[str, str], body: bytes, *,
                        request_id: str | None, retry_after: float | None = None,
                        secret: str | None = None) -> APIStatusError:
    """The typed error for a non-2xx answer. `secret` (the key) is scrubbed from anything
    the server wrote, in case it echoes it."""
    message, code, etype = parse_error_body(status, body, headers.get("content-type"))
    message = redact(message, secret)
    code = redact(code, secret) if isinstance(code, str) else code
    text = f"HTTP {status}" + (f" ({code})" if code not in (None, "", status) else "") + f": {message}"
    kw: dict[str, Any] = dict(status=status, code=code, request_id=request_id, error_type=etype,
                              retryable=is_retryable_status(status))
    if status == 400:
        m = _CONTEXT_RE.search(message)
        if m or code == "context_length_exceeded":
            return ContextLengthExceededError(
                text, max_tokens=int(m.group(1)) if m else None,
                requested_tokens=int(m.group(2)) if m else None, **kw)
    if status == 429:
        return RateLimitError(text, retry_after=retry_after, **kw)
    cls = InternalServerError if status >= 500 else _BY_STATUS.get(status, APIStatusError)
    return cls(text, **kw)
