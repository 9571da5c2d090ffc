"""The API key: loaded from the environment or a file, held so that it cannot leak by accident.

`ApiKey` never shows its value in repr/str and offers a
fingerprint (the sandbox ledger's `key_id`) for anything that must name a key. It refuses
to be pickled, so it cannot ride inside a serialized Beam DoFn.
"""
from __future__ import annotations

import hashlib
import os
from typing import NoReturn

ENV_VAR = "EMBEDDINGS_API_KEY"


class MissingApiKeyError(RuntimeError):
    """No key was configured; the message says where one is looked for (never a value)."""


def key_fingerprint(value: str) -> str:
    return "key-" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:12]


class ApiKey:
    __slots__ = ("_value",)

    def __init__(self, value: str):
        value = value.strip()
        if not value:
            raise MissingApiKeyError("the API key is empty")
        if not all(" " < ch < "\x7f" for ch in value):  # never quote the value: it is the secret
            raise MissingApiKeyError("the API key holds spaces, line breaks or non-ASCII characters "
                                     "(a key file must hold the key alone, on one line)")
        self._value = value

    def reveal(self) -> str:
        """The raw key, for the Authorization header only."""
        return self._value

    @property
    def fingerprint(self) -> str:
        return key_fingerprint(self._value)

    def __repr__(self) -> str:
        return f"ApiKey({self.fingerprint})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ApiKey) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> NoReturn:
        # A pickled DoFn would carry the key into the job graph; workers load it in setup().
        raise TypeError("ApiKey cannot be pickled: load it on the worker with load_api_key()")


def load_api_key(file: str | None = None, env_var: str = ENV_VAR) -> ApiKey:
    """The key from FILE when given, else from the environment variable."""
    if file:
        try:
            with open(file, encoding="utf-8") as fh:
                return ApiKey(fh.read())
        except OSError as exc:
            raise MissingApiKeyError(f"cannot read the API key file {file}: {exc.strerror}") from None
    value = os.environ.get(env_var, "")
    if not value.strip():
        raise MissingApiKeyError(f"no API key: set {env_var} or pass --api-key-file PATH")
    return ApiKey(value)


class KeySource:
    """Where a worker finds the key: a file, a secret manager name, or the environment.

    Picklable and holds no key, so it can travel inside a DoFn; `load()` runs on the worker.
    """

    def __init__(self, file: str | None = None, secret: str | None = None, env_var: str = ENV_VAR):
        self.file, self.secret, self.env_var = file, secret, env_var

    def load(self) -> ApiKey:
        if self.secret:
            return _from_secret_manager(self.secret)
        return load_api_key(self.file, self.env_var)

    def __repr__(self) -> str:
        where = f"secret {self.secret}" if self.secret else f"file {self.file}" if self.file else f"${self.env_var}"
        return f"KeySource({where})"


def _from_secret_manager(name: str) -> ApiKey:
    """NAME is a Secret Manager version ('projects/P/secrets/S/versions/latest'). The library
    is an optional extra ('embedpipe[gcp]'), imported only when this is used."""
    try:
        from google.cloud import secretmanager
    except ImportError:
        raise MissingApiKeyError("--api-key-secret needs google-cloud-secret-manager on the workers: "
                                 "install embedpipe[gcp]") from None
    try:
        reply = secretmanager.SecretManagerServiceClient().access_secret_version(name=name)
    except Exception as exc:  # the library raises many types; say which secret, never a value
        raise MissingApiKeyError(f"cannot read secret {name}: {type(exc).__name__}") from None
    return ApiKey(reply.payload.data.decode("utf-8"))
