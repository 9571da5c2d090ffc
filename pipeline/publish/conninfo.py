"""The secrets a libpq URL or connection string carries, wherever they are: a secret parameter
itself, or one inside a parameter's value that is itself a URL or connection string (libpq
reads a `dbname` that is one as its own), percent-encoded or not, at any depth. Nothing here
keeps or shows a value."""
from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict

_DEPTH = 4   # nestings read; a value nested deeper is refused as it is
_USERINFO_PASSWORD = re.compile(r"://[^/@?#\s]*:[^/@?#\s]*@")   # scheme://user:password@


def secrets_in(params: Mapping[str, object], secret: frozenset[str], depth: int = 0) -> list[tuple[str, str]]:
    """(where, parameter) of each secret in PARAMS (conninfo_to_dict's): WHERE is "" for PARAMS'
    own, else the parameter whose value holds it; SECRET: libpq's secret parameters."""
    found = []
    for key, value in params.items():
        if key in secret and value:
            found.append(("", key))
        elif isinstance(value, str):
            found += [(key, inner) for _, inner in _nested(value, secret, depth)]
    return list(dict.fromkeys(found))


def _nested(value: str, secret: frozenset[str], depth: int) -> list[tuple[str, str]]:
    """The secrets of VALUE and of each of its percent-decodings."""
    found: list[tuple[str, str]] = []
    seen = set()
    while value not in seen:
        seen.add(value)
        if _USERINFO_PASSWORD.search(value):
            found.append(("", "password"))
        found += [("", key) for key in secret if re.search(rf"(?i)\b{re.escape(key)}\s*=", value)]
        if depth < _DEPTH and ("=" in value or "://" in value):
            try:
                found += secrets_in(conninfo_to_dict(value), secret, depth + 1)
            except psycopg.ProgrammingError:   # not a connection string: the searches above stand
                pass
        value = unquote(value)
    return found


def nested(value: str) -> bool:
    """Whether VALUE reads as a URL or connection string (shown by no message)."""
    return any(mark in unquote(value) for mark in ("://", "=", "@"))
