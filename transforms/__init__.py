"""One Beam PTransform per step, with the pure logic it needs beside it.

Imported wherever the steps run (driver and workers), so Beam's S3 filesystem shares its
boto3 clients there (transforms/worker/s3clients.py says why)."""
from transforms.worker.s3clients import share_boto3_clients

share_boto3_clients()
