"""NAME and the names of the tables beside it, in its schema (pipeline/publish/database.py
says what each holds)."""
from __future__ import annotations

import dataclasses
import hashlib
import secrets

from psycopg import sql

from transforms.publish.sql import ident


@dataclasses.dataclass(frozen=True)
class Names:
    schema: str
    name: str

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.schema}.{self.name}".encode()).hexdigest()[:8]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    def new(self, prefix: str) -> str:
        return f"{prefix}{self.key}_{secrets.token_hex(4)}"

    def __call__(self, table: str | None = None) -> sql.Composed:
        return ident(self.schema, table or self.name)


def regclass(schema: str, name: str) -> str:
    """SCHEMA.NAME as to_regclass() takes it: quoted."""
    return sql.Identifier(schema, name).as_string(None)
