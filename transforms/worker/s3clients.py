"""Beam's S3 filesystem builds a new boto3 session and client for every operation (every
open, exists, match, rename), which costs ~0.1 s of CPU each in botocore's model loading: a
run on S3 spent most of its driver time there (the journal, the progress reports, the summary).
boto3 clients are thread-safe, so one client per configuration is shared instead; Beam's
own per-operation state (download streams) stays in its wrapper, which is still made anew.
"""
from __future__ import annotations

import threading
import types

_lock = threading.Lock()
_clients: dict = {}


class _SharedClientSession:
    """Stands in for boto3.session.Session() in Beam's S3 client: same `client(...)` call."""

    def __init__(self, boto3_module):
        self._boto3 = boto3_module

    def client(self, **kwargs):
        key = tuple(sorted((k, str(v)) for k, v in kwargs.items()))
        with _lock:
            if key not in _clients:
                _clients[key] = self._boto3.session.Session().client(**kwargs)
            return _clients[key]


class _Boto3:
    """The boto3 module as Beam's S3 client sees it, with sessions that share clients."""

    def __init__(self, boto3_module):
        self._real = boto3_module
        self.session = types.SimpleNamespace(Session=lambda: _SharedClientSession(boto3_module))

    def __getattr__(self, name):
        return getattr(self._real, name)


def share_boto3_clients() -> None:
    """Install the sharing into Beam's S3 client module; a no-op without the aws extra."""
    try:
        from apache_beam.io.aws.clients.s3 import boto3_client
    except ImportError:
        return
    if boto3_client.boto3 is not None and not isinstance(boto3_client.boto3, _Boto3):
        boto3_client.boto3 = _Boto3(boto3_client.boto3)
