"""The job's steps, a package each (read/, dedupe/, embed/, write/; pack.py), with the Beam
part in `transform.py` and the pure logic beside it; money/ and worker/ serve several steps.

Imported wherever the steps run (driver and workers), so Beam's S3 filesystem shares its
boto3 clients there (transforms/worker/s3clients.py says why)."""
from transforms.worker.s3clients import share_boto3_clients

share_boto3_clients()
