"""What one worker process keeps for a run: shared objects, digest indexes, coders, S3 clients, progress counts."""
