"""The HTTP server: routes, authentication, validation, billing, fault injection.

Status codes of the embeddings endpoint (what-the-spec-leaves-open.md): 200; 400 for an
unknown model, malformed input, an over-length input or a request over the model's caps;
401 for a missing, wrong or revoked key (one body for all, so a caller cannot tell them
apart); 402 when the cost does not fit the account balance or the key budget (OpenRouter-
style services answer 402 "insufficient credits" for both); 403 for a model the key may not
use (`models:` of the accounts file, `--key-models`); 413 for a body over --max-body-bytes;
429 with Retry-After when rate limited; 5xx and resets only when injected.
A refused request is never charged.
"""
from __future__ import annotations

import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import math
import socket
import struct
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from service.catalog import ConfigError, ModelSpec
from service.tokenizer import get_encoding

from .capacity import Capacity, OverCapacity
from .config import KeySpec, SandboxConfig
from .embedder import embed_batch
from .faults import FaultInjector
from .money import cost_micro, from_micro
from .ratelimit import TokenBuckets
from .store import Charge, ChargeResult, Store, offset_clock

log = logging.getLogger("service.sandbox")

_MAX_REQUEST_ID = 200
_DRAIN_CHUNK = 1 << 16


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: int | str | None = None,
                 type_: str = "invalid_request_error", headers: Sequence[tuple[str, str]] = ()):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, tuple(headers)
        self.code = status if code is None else code
        self.type = type_

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "type": self.type}}


def _bad(message: str, code: str = "invalid_request_error") -> ApiError:
    return ApiError(400, message, code=code)


def _rate_limited(wait_s: int, message: str) -> ApiError:
    return ApiError(429, message, type_="rate_limit_error", headers=[("Retry-After", str(wait_s))])


def _model_not_allowed(model: str) -> ApiError:
    # Names the model, never the key: the caller knows which key it sent.
    return ApiError(403, f"The model '{model}' is not allowed for this API key.", code="model_not_allowed",
                    type_="permission_error")


UNAUTHORIZED = ApiError(401, "Invalid or missing API key. Send 'Authorization: Bearer <API_KEY>'.",
                        type_="authentication_error")


class Sandbox:
    """Everything the request handlers share."""

    def __init__(self, config: SandboxConfig):
        self.config = config
        clock = {"clock": offset_clock(config.clock_file)} if config.clock_file else {}
        self.store = Store(config.db, **clock)
        for account, balance in config.balances_micro.items():
            self.store.ensure_account(account, balance)
        for key in config.keys:
            self.store.ensure_key(key.key_id, key.account, key.budget_micro)
        self.faults = FaultInjector(config.faults)
        self.capacity = Capacity(config.capacity, config.capacity_mode)
        self.account_limits = TokenBuckets(config.account_rps, config.account_burst)
        rps = config.faults.embeddings_rps
        self.embedding_limits = (TokenBuckets(rps, config.faults.embeddings_burst or max(1.0, rps))
                                 if rps else None)
        self.encoding = get_encoding("cl100k_base")   # load before reporting ready
        embed_batch("warm-up", ["warm up"], 8)         # builds the embedder's tables
        prefix = "/v1/" + config.account_segment
        self.routes = {("POST", "/v1/embeddings"): "embeddings", ("GET", prefix + "/balance"): "balance",
                       ("GET", prefix + "/stats"): "stats", ("GET", "/healthz"): "healthz"}
        self._in_flight = 0
        self._idle = threading.Condition()

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Counts the requests being answered, for wait_idle."""
        with self._idle:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    def wait_idle(self) -> None:
        """Return once no request is being answered."""
        with self._idle:
            self._idle.wait_for(lambda: not self._in_flight)

    def authenticate(self, header: str | None) -> KeySpec:
        scheme, _, value = (header or "").partition(" ")
        value = value.strip()
        presented = hashlib.sha256(value.encode("utf-8")).digest() if scheme.lower() == "bearer" and value else b""
        found = None
        for key in self.config.keys:   # compare with every key, in constant time each
            if hmac.compare_digest(presented, key.digest):
                found = key
        if found is None or self.faults.revoked(found.key_id):
            raise UNAUTHORIZED
        return found

    def count_tokens(self, model: ModelSpec, texts: list[str]) -> list[int]:
        # In the request's own thread: tiktoken releases the GIL as it encodes, so the requests
        # in flight already share the cores. A pool per request cost more CPU (1.6x on one
        # request, 6% over a capacity run) for a speed the latency hides (it includes the work).
        counts = [len(self.encoding.encode_ordinary(t)) for t in texts]
        skew = self.config.token_skew.get(model.name)
        return [math.ceil(n * skew) for n in counts] if skew else counts


def parse_embedding_request(body: Any, models: Mapping[str, ModelSpec]) -> tuple[ModelSpec, list[str], int | None, str]:
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.")
    unknown = sorted(set(body) - {"model", "input", "encoding_format", "dimensions", "user"})
    if unknown:
        raise _bad(f"Unrecognized request argument supplied: {', '.join(unknown)}")
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise _bad("'model' is required and must be a string.")
    model = models.get(name)
    if model is None:
        raise ApiError(400, f"The model '{name}' does not exist.", code="model_not_found")
    raw = body.get("input")
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list) and raw:
        texts = raw
    else:
        raise _bad("'input' is required: a non-empty string or a non-empty array of strings.")
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text:
            raise _bad(f"'input[{i}]' must be a non-empty string.")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise _bad(f"'encoding_format' must be 'float' or 'base64', got {fmt!r}.")
    dims = body.get("dimensions")
    if dims is not None:
        if not model.supports_dimensions:
            raise _bad(f"The model '{name}' does not support 'dimensions'.")
        if isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= model.dimensions:
            raise _bad(f"'dimensions' must be an integer from 1 to {model.dimensions}.")
    return model, texts, dims, fmt


def check_caps(model: ModelSpec, counts: list[int]) -> None:
    for n in counts:
        if n > model.max_input_tokens:
            raise ApiError(400, f"This model's maximum context length is {model.max_input_tokens} tokens, "
                                f"however you requested {n} tokens ({n} in your prompt; 0 for the "
                                "completion). Please reduce your prompt; or completion length.",
                           code="context_length_exceeded")
    total = sum(counts)
    if total > model.max_tokens_per_request:
        raise ApiError(400, f"Requested {total} tokens, max {model.max_tokens_per_request} tokens "
                            "per request.", code="max_tokens_per_request")


def precheck_estimate(model: ModelSpec, n_inputs: int) -> int:
    """Production's pre-check estimate, micro-RUB: every input at the model's maximum context,
    capped by the request cap, i.e. price x min(n_inputs x max_input_tokens, max_tokens_per_request)."""
    return cost_micro(min(n_inputs * model.max_input_tokens, model.max_tokens_per_request),
                      model.price_per_token)


def embeddings_body(vectors: np.ndarray, fmt: str, model: str, usage: dict[str, Any]) -> bytes:
    """The 200 answer. base64 items are assembled as bytes: base64 needs no JSON escaping,
    and json.dumps over megabytes of it was the slowest step of a large request."""
    if fmt == "base64":
        little = vectors.astype("<f4", copy=False)
        items = b",".join(b'{"object":"embedding","index":%d,"embedding":"%s"}'
                          % (i, binascii.b2a_base64(v.tobytes(), newline=False)) for i, v in enumerate(little))
    else:
        items = json.dumps([{"object": "embedding", "index": i, "embedding": v}
                            for i, v in enumerate(vectors.tolist())], separators=(",", ":")).encode()[1:-1]
    return b'{"object":"list","data":[%s],"model":%s,"usage":%s}' % (
        items, json.dumps(model).encode(), json.dumps(usage, separators=(",", ":")).encode())


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive
    server_version = "embedpipe-sandbox"
    timeout = 300                   # an idle keep-alive connection's thread ends after this
    sandbox: Sandbox                # set on the subclass made by make_server

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    # -- plumbing -------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        self._body_read = False
        self.sandbox = type(self).sandbox   # one sandbox for the whole request, though renewed meanwhile
        with self.sandbox.request():
            self._answer(method, path)

    def _answer(self, method: str, path: str) -> None:
        try:
            route = self.sandbox.routes.get((method, path))
            if route is None:
                if any(p == path for _, p in self.sandbox.routes):
                    raise ApiError(405, f"Method {method} not allowed on {path}.")
                raise ApiError(404, f"No such endpoint: {path}.", type_="not_found_error")
            if route == "healthz":
                self._send(200, {"status": "ok", "faults_injected": dict(self.sandbox.faults.injected),
                                 "capacity": self.sandbox.capacity.report()})
                return
            key = self.sandbox.authenticate(self.headers.get("Authorization"))
            getattr(self, "_" + route)(key)
        except ApiError as err:
            self._drain()
            if err.status >= 500 or err.status == 429:
                log.info("%s %s -> %d", method, path, err.status)
            self._send(err.status, err.body(), err.headers)
        except _Reset:
            pass
        except ConnectionError:   # the client left (e.g. timed out during a slow answer)
            log.info("%s %s -> client disconnected", method, path)
            self.close_connection = True
        except Exception:
            log.exception("internal error on %s %s", method, path)
            self._drain()
            self._send(500, ApiError(500, "Internal error.", type_="server_error").body())

    def _send(self, status: int, obj: dict[str, Any] | bytes, headers: Sequence[tuple[str, str]] = ()) -> None:
        body = obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _content_length(self) -> int:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise ApiError(411, "Send the body with a Content-Length.")
        try:
            n = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            n = -1
        if n < 0:
            self.close_connection = True
            raise _bad("Invalid Content-Length.")
        return n

    def _drain(self) -> None:
        """Read an unread body so the keep-alive connection stays usable (closing a socket with
        unread data makes the kernel send RST, and the client would lose our answer)."""
        if self._body_read or self.command not in ("POST", "PUT", "PATCH"):
            return
        self._body_read = True
        try:
            left = self._content_length()
        except ApiError:
            return
        while left > 0:
            chunk = self.rfile.read(min(left, _DRAIN_CHUNK))
            if not chunk:
                self.close_connection = True
                return
            left -= len(chunk)

    def _read_json(self) -> Any:
        n = self._content_length()
        if n > self.sandbox.config.max_body_bytes:
            raise ApiError(413, f"Request body of {n} bytes is over the limit of "
                                f"{self.sandbox.config.max_body_bytes} bytes.")
        self._body_read = True
        raw = self.rfile.read(n)
        if len(raw) != n:
            self.close_connection = True
            raise _bad("Incomplete request body.")
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            raise _bad("Content-Type must be application/json.")
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            raise _bad("The request body is not valid JSON.") from None

    def _reset(self) -> None:
        """Abort the connection with RST, as a crashing proxy would."""
        log.info("%s %s -> connection reset (injected)", self.command, self.path)
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()
        raise _Reset

    # -- endpoints ------------------------------------------------------------------------

    def _account_limit(self, key: KeySpec) -> None:
        wait = self.sandbox.account_limits.take(key.key_id)
        if wait:
            raise _rate_limited(wait, "Rate limit exceeded for the statistics API; retry later.")

    def _balance(self, key: KeySpec) -> None:
        self._account_limit(key)
        balance, budget = self.sandbox.store.balance(key.key_id)
        body = {"balance": from_micro(balance)}
        if budget is not None:
            body["budget"] = from_micro(budget)
        self._send(200, body)

    def _stats(self, key: KeySpec) -> None:
        self._account_limit(key)
        daily, monthly = self.sandbox.store.usage(key.account, self.sandbox.config.tz)
        self._send(200, {"daily_usage": from_micro(daily), "monthly_usage": from_micro(monthly)})

    def _embeddings(self, key: KeySpec) -> None:
        sb = self.sandbox
        if not sb.faults.admit_embeddings(key.key_id):
            raise UNAUTHORIZED
        if sb.embedding_limits is not None:
            wait = sb.embedding_limits.take(key.key_id)
            if wait:
                raise _rate_limited(wait, "Rate limit exceeded for embeddings requests.")
        model, texts, dims, fmt = parse_embedding_request(self._read_json(), sb.config.models)
        if not key.allows(model.name):
            raise _model_not_allowed(model.name)   # before the fault draw and the charge
        request_id = self.headers.get("X-Request-Id") or uuid.uuid4().hex
        if len(request_id) > _MAX_REQUEST_ID or not request_id.isprintable():
            raise _bad(f"X-Request-Id must be at most {_MAX_REQUEST_ID} printable characters.")
        fault = sb.faults.draw()
        self._inject_before(fault)
        if len(texts) > model.max_inputs_per_request:
            raise ApiError(400, f"Too many inputs: {len(texts)}, max {model.max_inputs_per_request} "
                                "per request for this model.", code="too_many_inputs")
        try:
            with sb.capacity.slot(key.account):
                result, total, cost, vectors = self._work(key, model, texts, dims, request_id)
        except OverCapacity:
            raise _rate_limited(sb.config.capacity_retry_after_s,
                                f"Too many concurrent requests for this account (at most {sb.capacity.capacity} "
                                "at once); retry later.") from None
        if fault == "slow":
            time.sleep(sb.config.faults.slow_s)
        elif fault == "reset_after_charge":
            self._reset()
        usage = {"prompt_tokens": total, "total_tokens": total, "cost_rub": from_micro(cost),
                 "balance": from_micro(result.balance_micro)}
        self._send(200, embeddings_body(vectors, fmt, model.name, usage), [("X-Request-Id", request_id)])

    def _work(self, key: KeySpec, model: ModelSpec, texts: list[str], dims: int | None,
              request_id: str) -> tuple[ChargeResult, int, int, np.ndarray]:
        """What one of the account's places is held for (--capacity): count, embed, wait, bill.
        The answer leaves the latency after the work began: like a real service's, the latency
        includes the work, so the sandbox's own CPU on a loaded machine does not lengthen it."""
        sb = self.sandbox
        began = time.monotonic()
        counts = sb.count_tokens(model, texts)
        check_caps(model, counts)
        total = sum(counts)
        cost = cost_micro(total, model.price_per_token)
        if sb.config.precheck:
            self._precheck(key, model, len(texts))
        vectors = embed_batch(model.name, texts, dims or model.dimensions, model.dimensions)
        wait_s = (sb.config.faults.latency_ms / 1e3 + sb.config.faults.latency_per_token_us * total / 1e6)
        left_s = began + wait_s - time.monotonic()
        if left_s > 0:
            time.sleep(left_s)
        shas = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]
        result = sb.store.charge(Charge(request_id, key.key_id, model.name, total, total, cost, shas))
        if not result.ok:
            raise self._insufficient(result.refusal, cost)
        return result, total, cost, vectors

    def _inject_before(self, fault: str | None) -> None:
        if fault == "reset":
            self._reset()
        if fault == "status_429":
            raise _rate_limited(self.sandbox.config.faults.retry_after_s, "Rate limit reached (injected).")
        if fault in ("status_500", "status_502", "status_503"):
            status = int(fault[-3:])
            raise ApiError(status, f"{HTTPStatus(status).phrase} (injected).", type_="server_error")

    def _precheck(self, key: KeySpec, model: ModelSpec, n_inputs: int) -> None:
        estimate = precheck_estimate(model, n_inputs)
        balance, budget = self.sandbox.store.balance(key.key_id)
        if estimate > balance:
            raise self._insufficient("balance", estimate, estimated=True)
        if budget is not None and estimate > budget:
            raise self._insufficient("budget", estimate, estimated=True)

    @staticmethod
    def _insufficient(refusal: str, cost: int, estimated: bool = False) -> ApiError:
        what = f"the estimated cost {from_micro(cost):.6f} RUB (at the model's maximum context)" if estimated \
            else f"the cost {from_micro(cost):.6f} RUB"
        if refusal == "budget":
            return ApiError(402, f"Insufficient credits: the key's remaining budget does not cover {what}.",
                            type_="insufficient_budget")
        return ApiError(402, f"Insufficient credits: the account balance does not cover {what}.",
                        type_="insufficient_balance")


class _Reset(Exception):
    """The connection was aborted on purpose; nothing more to send."""


class SandboxServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256   # 64+ clients connecting at once must not get refused
    RequestHandlerClass: type[Handler]

    @property
    def sandbox(self) -> Sandbox:
        return self.RequestHandlerClass.sandbox

    def renew(self, config: SandboxConfig) -> Sandbox:
        """Serve a new Sandbox of CONFIG on this socket in place of the current one, which is
        returned once it answers no request (its store still open). The new one starts as a new
        process's would: its own database, fault draws, capacity and rate limits."""
        if (config.host, config.port) != self.server_address[:2]:
            raise ConfigError(f"a renewed sandbox serves the address it started on, not {config.host}:{config.port}")
        old = self.sandbox
        old.wait_idle()
        self.RequestHandlerClass.sandbox = Sandbox(config)
        old.wait_idle()   # a request that came meanwhile
        return old


def make_server(config: SandboxConfig) -> tuple[SandboxServer, Sandbox]:
    sandbox = Sandbox(config)
    handler = type("BoundHandler", (Handler,), {"sandbox": sandbox})
    return SandboxServer((config.host, config.port), handler), sandbox
