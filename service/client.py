"""Typed HTTP client of the embeddings service (spec: /work/shared/spec/service-api.md).

One retry loop (`EmbeddingsClient._call`) serves every endpoint: exponential backoff with
jitter, Retry-After / retry-after-ms honoured, a cap on attempts and on total time. An
embeddings attempt waits a read timeout that follows the latency (service/timeouts.py), and a
request has at most `MAX_TIMED_OUT` timed-out attempts: each may be billed. urllib3's
own retries are off so nothing else retries behind its back. The same X-Request-Id goes out on
every attempt of one logical request, so the service's ledger can tie retries together.

The key lives in an ApiKey and is put on the wire by `_BearerAuth` only; errors carry plain
data, never the requests Response/PreparedRequest (which hold the Authorization header).
"""
from __future__ import annotations

import binascii
import dataclasses
import email.utils
import functools
import json
import logging
import math
import random
import threading
import time
import uuid
from typing import Any, TypeVar
from collections.abc import Callable, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

import numpy as np
import requests
import requests.adapters
import requests.auth
import urllib3.exceptions

from service.credentials import ApiKey
from service.errors import (APIConnectionError, APITimeoutError, EmbeddingsError,
                            InvalidResponseError, error_from_response)
from service.timeouts import Attempt, ReadTimeouts

# Attempts of one request that may time out: each was sent and may be billed, so a text is
# billed at most twice by one request; the second waits the ceiling (service/timeouts.py).
MAX_TIMED_OUT = 2

log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying one logical request. The pipeline fills these from configs/."""
    max_attempts: int = 6            # attempts that fail (first try included); a 429 is not one
    max_refusals: int = 20           # 429s one request may meet: the service asks for a wait, the
                                     # request is not at fault (several clients sharing an account's
                                     # capacity can refuse one request many times in a row)
    initial_backoff_s: float = 0.5   # wait before the 2nd attempt; doubles each retry
    max_backoff_s: float = 20.0      # cap of one computed wait (a Retry-After may exceed it)
    max_total_s: float = 120.0       # no retry starts if its wait would end after this
    jitter: float = 0.25             # computed waits shrink by up to this fraction; server ones grow
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0     # per socket read, as requests defines it: the floor of the
                                     # adaptive timeout (service/timeouts.py)
    read_timeout_max_s: float = 300.0  # its ceiling, and the wait of the one retry after a timeout

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.max_refusals < 0:
            raise ValueError("max_refusals must be >= 0")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be in [0, 1]")
        for name in ("initial_backoff_s", "max_backoff_s", "max_total_s",
                     "connect_timeout_s", "read_timeout_s"):
            if getattr(self, name) < 0 or (name.endswith("timeout_s") and getattr(self, name) == 0):
                raise ValueError(f"{name} must be positive")
        if self.read_timeout_max_s < self.read_timeout_s:
            raise ValueError("read_timeout_max_s must be >= read_timeout_s")


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the server asks us to wait: retry-after-ms first, then Retry-After as seconds
    or as an HTTP date. None when absent or unreadable. `headers` keys are lower case."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            continue
        if seconds == seconds and seconds != float("inf"):   # not NaN/inf
            return max(0.0, seconds)
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def backoff_delay(policy: RetryPolicy, retry_number: int, retry_after: float | None,
                  rand: float) -> float:
    """Wait before retry number `retry_number` (1 = the 2nd attempt); rand in [0, 1).

    A positive Retry-After is a floor: jitter only lengthens it, so clients told the same
    time do not all come back at once. Otherwise initial * 2^(n-1), capped, minus jitter."""
    if retry_after is not None and retry_after > 0:
        return retry_after * (1 + policy.jitter * rand)
    base = min(policy.initial_backoff_s * 2.0 ** min(retry_number - 1, 60), policy.max_backoff_s)
    return base * (1 - policy.jitter * rand)


def next_wait(policy: RetryPolicy, attempts_made: int, elapsed_s: float,
              retry_after: float | None, rand: float, refusals: int = 0) -> float | None:
    """The wait before the next attempt, or None when attempts, refusals or total time are used
    up. REFUSALS: how many of the attempts made were 429s; they count against max_refusals, the
    others against max_attempts."""
    if attempts_made - refusals >= policy.max_attempts or refusals > policy.max_refusals:
        return None
    wait = backoff_delay(policy, attempts_made, retry_after, rand)
    if elapsed_s + wait > policy.max_total_s:
        return None
    return wait


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    total_tokens: int
    cost_rub: float | None     # None only when a compatible server does not report it
    balance: float | None      # balance after this request, RUB


@dataclasses.dataclass(frozen=True)
class EmbedResult:
    model: str
    vectors: np.ndarray        # float32 (n, d), row i = inputs[i]
    usage: Usage
    request_id: str
    attempts: int
    latency_ms: float          # wall time of the whole logical request, retries and waits included
    status: int
    uncertain_attempts: int    # failed after sending (read timeout, reset, 5xx): may be billed
    timed_out_attempts: int = 0  # of those, read timeouts: the service was still working on them


@dataclasses.dataclass(frozen=True)
class Balance:
    balance: float
    budget: float | None


@dataclasses.dataclass(frozen=True)
class Stats:
    daily_usage: float
    monthly_usage: float


_NOT_JSON = object()


class _Invalid(ValueError):
    """A 2xx body that breaks the spec; becomes InvalidResponseError."""

    def __init__(self, message: str, undecodable: bool = False):
        super().__init__(message)
        self.undecodable = undecodable


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Invalid(f"{what} is {value!r}, expected a finite number")
    return float(value)


def _count(value: Any, what: str) -> int:
    number = _number(value, what)
    if number < 0 or not number.is_integer():
        raise _Invalid(f"{what} is {value!r}, expected a non-negative integer")
    return int(number)


def parse_usage(doc: Mapping[str, Any]) -> Usage:
    usage = doc.get("usage")
    if not isinstance(usage, Mapping):
        raise _Invalid("the response has no usage object")
    prompt = _count(usage.get("prompt_tokens"), "usage.prompt_tokens")
    total = _count(usage.get("total_tokens", prompt), "usage.total_tokens")
    cost, balance = usage.get("cost_rub"), usage.get("balance")
    if cost is not None and _number(cost, "usage.cost_rub") < 0:
        raise _Invalid(f"usage.cost_rub is {cost!r}, a negative cost")
    return Usage(prompt, total,
                 None if cost is None else _number(cost, "usage.cost_rub"),
                 None if balance is None else _number(balance, "usage.balance"))


def decode_vectors(data: Any, n_inputs: int) -> tuple[np.ndarray, str]:
    """(n, d) float32 ordered by `index`, and the encoding the server actually used."""
    if not isinstance(data, list):
        raise _Invalid("'data' is not a list")
    if len(data) != n_inputs:
        raise _Invalid(f"{len(data)} embeddings for {n_inputs} inputs")
    by_index: list[Any] = [None] * n_inputs
    seen = [False] * n_inputs
    for pos, item in enumerate(data):
        idx = item.get("index") if isinstance(item, Mapping) else None
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < n_inputs or seen[idx]:
            raise _Invalid(f"indexes are not a permutation of 0..{n_inputs - 1} "
                           f"(entry {pos} has index {idx!r})")
        seen[idx] = True
        by_index[idx] = item.get("embedding")
    kinds = {type(e) for e in by_index}
    if kinds == {str}:
        vectors = _decode_base64(by_index)
        encoding = "base64"
    elif kinds == {list}:
        _same_length([len(e) for e in by_index], "numbers")
        try:
            vectors = np.asarray(by_index, dtype=np.float32)
        except (TypeError, ValueError):
            raise _Invalid("an embedding list holds something other than numbers") from None
        encoding = "float"
    else:
        names = sorted(k.__name__ for k in kinds)
        raise _Invalid(f"embeddings are {names}; expected all base64 strings or all number lists")
    if not np.isfinite(vectors).all():
        raise _Invalid("vectors hold NaN or infinite values")
    return vectors, encoding


def _b64(text: str) -> bytes:
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):  # ValueError: not ASCII
        raise _Invalid("an embedding is not valid base64", undecodable=True) from None


def _decode_base64(encoded: list[str]) -> np.ndarray:
    """float32 rows of base64 strings, decoded one by one into one buffer: no decoded copy of a
    whole answer besides the matrix, which is writable (callers may normalise in place)."""
    width = len(_b64(encoded[0]))
    matrix = bytearray(width * len(encoded))
    view = memoryview(matrix)
    for row, text in enumerate(encoded):
        vector = _b64(text)
        if len(vector) != width:
            _same_length([len(_b64(e)) for e in encoded], "bytes")
        view[row * width:(row + 1) * width] = vector
    if width == 0:
        raise _Invalid("vectors are empty")
    if width % 4:
        raise _Invalid(f"base64 vectors of {width} bytes are not float32 arrays", undecodable=True)
    return np.frombuffer(matrix, dtype="<f4").reshape(len(encoded), width // 4)


@dataclasses.dataclass
class _Answer:
    """A 2xx embeddings body, parsed while its decoding slot was held (the body is not kept).
    PROBLEM is what breaks the spec, as text: an exception would keep the body's frames alive."""
    usage: Usage | None = None
    vectors: np.ndarray | None = None
    encoding: str | None = None
    model: Any = None
    problem: str | None = None
    undecodable: bool = False


def _json_object(body: bytes, status: int, headers: Mapping[str, str]) -> Mapping[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        doc = _NOT_JSON   # the decode error quotes the body: keep it out of any exception chain
    if doc is _NOT_JSON:
        ctype = headers.get("content-type", "unknown type").split(";")[0]
        raise _Invalid(f"HTTP {status} with a non-JSON body ({ctype}, {len(body)} bytes)")
    if not isinstance(doc, Mapping):
        raise _Invalid(f"HTTP {status} body is a JSON {type(doc).__name__}, not an object")
    return doc


def _parse_answer(body: bytes, status: int, headers: Mapping[str, str], n_inputs: int,
                  dimensions: int | None) -> _Answer:
    """An embeddings answer: usage, the (n_inputs, d) vectors, the encoding the server used."""
    answer = _Answer()
    try:
        doc = _json_object(body, status, headers)
        del body   # parsed: the bytes (5 MB for 2048 vectors) are not kept beside the parse
        answer.usage = parse_usage(doc)
        answer.vectors, answer.encoding = decode_vectors(doc.get("data"), n_inputs)
        if dimensions is not None and answer.vectors.shape[1] != dimensions:
            raise _Invalid(f"asked for {dimensions} dimensions, got {answer.vectors.shape[1]}")
        answer.model = doc.get("model")
    except _Invalid as exc:
        answer.vectors, answer.problem, answer.undecodable = None, str(exc), exc.undecodable
    return answer


def _same_length(lengths: list[int], unit: str) -> None:
    if len(set(lengths)) != 1:
        raise _Invalid(f"vectors differ in length: {min(lengths)}..{max(lengths)} {unit}")
    if lengths[0] == 0:
        raise _Invalid("vectors are empty")


class _BearerAuth(requests.auth.AuthBase):
    """Sets the header at send time. Passing auth also stops requests from replacing it with
    credentials from ~/.netrc."""

    def __init__(self, key: ApiKey):
        self._key = key

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = "Bearer " + self._key.reveal()
        return request

    def __repr__(self) -> str:
        return f"_BearerAuth({self._key!r})"


@dataclasses.dataclass
class _Outcome:
    """One attempt: an HTTP answer, or a transport error (and whether the request had gone out)."""
    status: int = 0
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    body: bytes = b""
    error: EmbeddingsError | None = None
    sent: bool = True
    answer: _Answer | None = None
    timed_out: bool = False    # a read timeout: sent, and maybe still being worked on (and billed)
    waited_s: float | None = None   # from sending to the answer's headers


@dataclasses.dataclass
class _Reply:
    headers: dict[str, str]
    body: bytes
    status: int
    attempts: int
    uncertain_attempts: int
    latency_ms: float
    answer: _Answer | None = None
    timed_out_attempts: int = 0


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it wraps (requests -> urllib3 -> socket)."""
    stack: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack += [getattr(e, "reason", None), e.__cause__, e.__context__,
                  *(a for a in e.args if isinstance(a, BaseException))]


def _read_body(response: requests.Response) -> bytes:
    """The whole body in one read. requests' `.content` reads 10 KB at a time: on a 5 MB answer
    that is 3-4x the CPU. urllib3's errors become requests' own, as `.content` makes them."""
    try:
        return response.raw.read(decode_content=True)
    except urllib3.exceptions.ProtocolError as exc:
        raise requests.exceptions.ChunkedEncodingError(exc) from exc
    except urllib3.exceptions.DecodeError as exc:
        raise requests.exceptions.ContentDecodingError(exc) from exc
    except urllib3.exceptions.ReadTimeoutError as exc:
        raise requests.exceptions.ConnectionError(exc) from exc
    except urllib3.exceptions.SSLError as exc:
        raise requests.exceptions.SSLError(exc) from exc


def _transport_error(exc: requests.RequestException, url: str, timeout: tuple[float, float],
                     request_id: str) -> _Outcome:
    """Our typed error for a requests exception, built from strings only (no request object)."""
    chain = list(_causes(exc))
    root = next((e for e in reversed(chain) if isinstance(e, OSError)), exc)
    reason = f"{type(root).__name__}: {root}" if str(root) else type(root).__name__
    connect_phase = isinstance(exc, requests.exceptions.ConnectTimeout) or any(
        isinstance(e, urllib3.exceptions.ConnectTimeoutError) for e in chain)  # incl. refused, DNS
    read_timeout = isinstance(exc, requests.exceptions.ReadTimeout) or any(
        isinstance(e, urllib3.exceptions.ReadTimeoutError) for e in chain)
    kw: dict[str, Any] = dict(request_id=request_id)
    if connect_phase and isinstance(exc, requests.exceptions.Timeout):
        return _Outcome(error=APITimeoutError(f"connect timeout ({timeout[0]} s) to {url}", **kw),
                        sent=False)
    if connect_phase:
        return _Outcome(error=APIConnectionError(f"cannot connect to {url}: {reason}", **kw), sent=False)
    if read_timeout:
        return _Outcome(error=APITimeoutError(
            f"no response from {url} within the read timeout ({timeout[1]:g} s); the request was "
            "sent and may have been billed", **kw), timed_out=True)
    if isinstance(exc, (requests.ConnectionError, requests.exceptions.ChunkedEncodingError,
                        requests.exceptions.ContentDecodingError)):
        return _Outcome(error=APIConnectionError(
            f"connection to {url} broke after the request was sent ({reason}); it may have "
            "been billed", **kw))
    return _Outcome(error=EmbeddingsError(f"request to {url} failed: {reason}", retryable=False, **kw),
                    sent=False)


def check_base_url(url: str) -> None:
    """ValueError unless URL is a plain http(s) URL: no user:password@ (the key travels only in
    the Authorization header)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the base URL must be an http(s) URL such as https://host/v1, got {url!r}")
    if parts.username or parts.password:
        raise ValueError("the base URL must not carry credentials: the key goes in EMBEDDINGS_API_KEY")


class EmbeddingsClient:
    """Thread-safe: one requests.Session shared by all threads. Its per-request state is the
    urllib3 pool (thread-safe) and the cookie jar (locked; the service sets no cookies)."""

    def __init__(self, base_url: str, api_key: ApiKey, *, account_segment: str = "service",
                 retry: RetryPolicy = RetryPolicy(), pool_size: int = 32,
                 encoding_format: str = "base64", max_decoding: int = 2,
                 timeouts: ReadTimeouts | None = None):
        """TIMEOUTS: the adaptive read timeout, shared by the clients of a process (default:
        this client's own, from RETRY's read_timeout_s and read_timeout_max_s)."""
        if not isinstance(api_key, ApiKey):
            raise TypeError("api_key must be a service.credentials.ApiKey")
        check_base_url(base_url)
        if encoding_format not in ("base64", "float"):
            raise ValueError(f"encoding_format must be 'base64' or 'float', got {encoding_format!r}")
        if pool_size < 1 or max_decoding < 1:
            raise ValueError("pool_size and max_decoding must be >= 1")
        self.base_url = base_url.rstrip("/")
        self.account_segment = account_segment.strip("/")
        self.retry = retry
        self.encoding_format = encoding_format
        self._key = api_key
        self._auth = _BearerAuth(api_key)
        self._timeouts = timeouts or ReadTimeouts(retry.read_timeout_s, retry.read_timeout_max_s)
        self._fallback_lock = threading.Lock()
        # Answers read and decoded at once: each holds its bytes, the parsed JSON and the
        # vectors meanwhile (~15 MB for 2048 vectors of 1536 floats); the others wait unread.
        self._decoding = threading.BoundedSemaphore(max_decoding)
        self._session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=pool_size,
                                                max_retries=0)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)

    def at(self, base_url: str) -> EmbeddingsClient:
        """A client of this key and account segment at another BASE_URL (a hint's probe)."""
        return EmbeddingsClient(base_url, self._key, account_segment=self.account_segment, retry=self.retry,
                                pool_size=1, encoding_format=self.encoding_format)

    def __repr__(self) -> str:
        return (f"EmbeddingsClient(base_url={self.base_url!r}, key={self._key!r}, "
                f"encoding_format={self.encoding_format!r})")

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> EmbeddingsClient:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- endpoints ------------------------------------------------------------------------

    def embed(self, model: str, inputs: Sequence[str], *, dimensions: int | None = None,
              request_id: str | None = None,
              on_retry: Callable[[int], None] | None = None,
              on_timeout: Callable[[], None] | None = None,
              on_unanswered: Callable[[bool], None] | None = None) -> EmbedResult:
        """Embed `inputs` (a list of non-empty strings) in one logical request. `on_retry` is
        told the status (0 for a transport error) of each failed attempt about to be retried,
        so a caller can slow down on 429s that the retry loop absorbs; `on_timeout`, before
        the one retry of an attempt that timed out, so a caller can hold it until its queue
        at the service is shorter; `on_unanswered`, before the retry of an attempt sent
        without an answer (True: a read timeout; else a broken connection or a 5xx), which
        may have been billed, so a caller can count it as spent before another attempt goes.
        A hook that raises stops the request: the exception comes out of embed."""
        if isinstance(inputs, (str, bytes)):
            raise TypeError("inputs must be a sequence of strings, not a single string")
        inputs = list(inputs)
        if not inputs:
            raise ValueError("inputs is empty: nothing to embed")
        for i, text in enumerate(inputs):
            if not isinstance(text, str):
                raise TypeError(f"inputs[{i}] is {type(text).__name__}, expected str")
            if not text:
                raise ValueError(f"inputs[{i}] is an empty string; the service rejects those")
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty string")
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                       or dimensions < 1):
            raise ValueError(f"dimensions must be a positive integer, got {dimensions!r}")
        request_id = request_id or uuid.uuid4().hex
        encoding = self.encoding_format   # what this request asks for, whatever others switch to meanwhile
        payload: dict[str, Any] = {"model": model, "input": inputs, "encoding_format": encoding}
        if dimensions is not None:
            payload["dimensions"] = dimensions
        reply = self._call("POST", "/embeddings", request_id,
                           json.dumps(payload, ensure_ascii=False).encode("utf-8"), on_retry,
                           functools.partial(_parse_answer, n_inputs=len(inputs), dimensions=dimensions),
                           on_timeout, on_unanswered, billed=True)
        answer = reply.answer
        assert answer is not None   # _call returns a 2xx with PARSE's answer
        if answer.problem is not None:
            ignored = answer.undecodable and encoding == "base64"
            if ignored:
                self._use_float("its base64 vectors were not float32 arrays")
            error = self._invalid(answer.problem, reply, request_id, answer.usage)
            error.base64_ignored = ignored
            raise error
        assert answer.vectors is not None and answer.usage is not None   # parsed, as there is no problem
        if answer.encoding == "float" and encoding == "base64":
            self._use_float("it answered a base64 request with float lists")
        return EmbedResult(model=answer.model if isinstance(answer.model, str) else model,
                           vectors=answer.vectors, usage=answer.usage, request_id=request_id,
                           attempts=reply.attempts, latency_ms=reply.latency_ms,
                           status=reply.status, uncertain_attempts=reply.uncertain_attempts,
                           timed_out_attempts=reply.timed_out_attempts)

    def balance(self) -> Balance:
        return self._get("balance", lambda doc: Balance(
            _number(doc.get("balance"), "balance"),
            None if doc.get("budget") is None else _number(doc.get("budget"), "budget")))

    def stats(self) -> Stats:
        return self._get("stats", lambda doc: Stats(_number(doc.get("daily_usage"), "daily_usage"),
                                                    _number(doc.get("monthly_usage"), "monthly_usage")))

    # -- the one retry loop ---------------------------------------------------------------

    def _call(self, method: str, path: str, request_id: str, body: bytes | None = None,
              on_retry: Callable[[int], None] | None = None,
              parse: Callable[[bytes, int, Mapping[str, str]], _Answer] | None = None,
              on_timeout: Callable[[], None] | None = None,
              on_unanswered: Callable[[bool], None] | None = None, billed: bool = False) -> _Reply:
        """BILLED: an embeddings request, whose timeouts adapt and are counted (an account read
        waits read_timeout_s: its timeouts cost nothing)."""
        url = self.base_url + path
        started = time.monotonic()
        attempts = uncertain = refusals = timed_out = 0
        patient = None   # after a timeout: the read timeout of every later attempt
        while True:
            attempts += 1
            attempt = self._timeouts.begin(patient) if billed else Attempt(self.retry.read_timeout_s, 1)
            try:
                outcome = self._attempt(method, url, body, request_id, parse, attempt)
            finally:
                if billed:
                    self._timeouts.end()
            if billed and outcome.waited_s is not None:
                self._timeouts.observe(outcome.status, outcome.waited_s, attempt.sent_with)
            if outcome.error is None and 200 <= outcome.status < 300:
                return _Reply(outcome.headers, outcome.body, outcome.status, attempts, uncertain,
                              (time.monotonic() - started) * 1000, outcome.answer, timed_out)
            retry_after = None
            if outcome.error is not None:
                error = outcome.error
            else:
                retry_after = parse_retry_after(outcome.headers)
                error = error_from_response(outcome.status, outcome.headers, outcome.body,
                                            request_id=request_id, retry_after=retry_after,
                                            secret=self._key.reveal())
            unanswered = outcome.sent and (outcome.error is not None or outcome.status >= 500)
            uncertain += unanswered
            refused = outcome.error is None and outcome.status == 429
            refusals += refused
            elapsed = time.monotonic() - started
            if outcome.timed_out and billed:   # once more at most, waiting longer: max_total_s bounds persistence, not patience
                timed_out += 1
                patient = self._timeouts.after_timeout(attempt)
                wait = (backoff_delay(self.retry, attempts, None, random.random())
                        if timed_out < MAX_TIMED_OUT and attempts - refusals < self.retry.max_attempts else None)
            else:
                wait = (next_wait(self.retry, attempts, elapsed, retry_after, random.random(), refusals)
                        if error.retryable else None)
            if wait is None:
                error.attempts, error.uncertain_attempts = attempts, uncertain
                error.timed_out_attempts = timed_out
                error.latency_ms = elapsed * 1000
                raise error
            reason = (f"HTTP {outcome.status}" + (f" {error.code}" if error.code not in
                                                  (None, "", outcome.status) else "")
                      if outcome.error is None else type(error).__name__)
            what = (f"refused {refusals}/{self.retry.max_refusals}" if refused
                    else f"attempt {attempts - refusals}/{self.retry.max_attempts} failed")
            log.log(logging.INFO if refused else logging.WARNING,
                    "%s %s %s (%s); retrying in %.2f s%s [request_id=%s]", method, path, what, reason, wait,
                    " as the server asked" if retry_after else "", request_id)
            if on_retry is not None:
                on_retry(outcome.status if outcome.error is None else 0)
            if unanswered and billed and on_unanswered is not None:
                on_unanswered(outcome.timed_out)
            if outcome.timed_out and billed and on_timeout is not None:
                on_timeout()
            time.sleep(wait)

    def _attempt(self, method: str, url: str, body: bytes | None, request_id: str,
                 parse: Callable[[bytes, int, Mapping[str, str]], _Answer] | None,
                 attempt: Attempt) -> _Outcome:
        """One HTTP exchange, waiting up to the ATTEMPT's timeout for the answer. A 2xx body is
        read and PARSEd in one of the decoding slots."""
        headers = {"Accept": "application/json", "X-Request-Id": request_id}
        if body is not None:
            headers["Content-Type"] = "application/json"
        timeout = (self.retry.connect_timeout_s, attempt.timeout_s)
        try:
            sent = time.monotonic()
            response = self._session.request(method, url, data=body, headers=headers,
                                             auth=self._auth, timeout=timeout,
                                             allow_redirects=False, stream=True)
            waited = time.monotonic() - sent
            with response:
                got = {k.lower(): v for k, v in response.headers.items()}
                if parse is None or not 200 <= response.status_code < 300:
                    return _Outcome(status=response.status_code, body=_read_body(response), headers=got,
                                    waited_s=waited)
                with self._decoding:
                    answer = parse(_read_body(response), response.status_code, got)
        except requests.RequestException as exc:
            return _transport_error(exc, url, timeout, request_id)
        return _Outcome(status=response.status_code, headers=got, answer=answer, waited_s=waited)

    # -- helpers --------------------------------------------------------------------------

    def _get(self, endpoint: str, build: Callable[[Mapping[str, Any]], _T]) -> _T:
        """GET an account endpoint and BUILD the result from its JSON."""
        request_id = uuid.uuid4().hex
        reply = self._call("GET", f"/{self.account_segment}/{endpoint}", request_id)
        problem = None
        try:
            return build(_json_object(reply.body, reply.status, reply.headers))
        except _Invalid as exc:
            problem = exc
        raise self._invalid(str(problem), reply, request_id, None)

    @staticmethod
    def _invalid(message: str, reply: _Reply, request_id: str | None,
                 usage: Usage | None) -> InvalidResponseError:
        error = InvalidResponseError(f"invalid response: {message}", usage=usage, status=reply.status,
                                     request_id=request_id, attempts=reply.attempts,
                                     uncertain_attempts=reply.uncertain_attempts,
                                     latency_ms=reply.latency_ms)
        error.timed_out_attempts = reply.timed_out_attempts
        return error

    def _use_float(self, why: str) -> None:
        with self._fallback_lock:
            if self.encoding_format == "float":
                return
            self.encoding_format = "float"
        log.warning("the service ignores encoding_format=base64 (%s): asking for float from now on",
                    why)
