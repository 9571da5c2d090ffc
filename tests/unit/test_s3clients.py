"""Beam's S3 client wrappers share one boto3 client per configuration (transforms/worker/s3clients.py)."""
from __future__ import annotations

import pytest

import transforms  # noqa: F401  (installs the sharing)

boto3_client = pytest.importorskip("apache_beam.io.aws.clients.s3.boto3_client")


def options(endpoint: str) -> dict:
    return {"s3_region_name": "us-east-1", "s3_endpoint_url": endpoint,
            "s3_access_key_id": "test", "s3_secret_access_key": "test"}


def test_one_boto3_client_per_configuration():
    a, b = boto3_client.Client(options("http://127.0.0.1:9")), boto3_client.Client(options("http://127.0.0.1:9"))
    other = boto3_client.Client(options("http://127.0.0.1:10"))
    assert a is not b and a.client is b.client   # Beam's per-operation wrapper, one boto3 client
    assert other.client is not a.client
