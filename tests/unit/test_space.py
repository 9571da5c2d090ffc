"""A full disk is recognised however it arrives: an OSError, inside Beam's batch file errors,
or as the text of a worker's error that the runner wrapped; nothing else is."""
from __future__ import annotations

import errno
import logging

from apache_beam.io.filesystem import BeamIOError

from pipeline.outdir import space


def test_a_full_disk_is_recognised_however_it_arrives():
    full = OSError(errno.ENOSPC, "No space left on device")
    assert space.is_full(full) and space.is_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert space.is_full(BeamIOError("Rename operation failed", {("a", "b"): full}))
    assert space.is_full(RuntimeError("OSError: [Errno 28] No space left on device [while running 'Write/Embeddings']"))
    assert not space.is_full(OSError(errno.EACCES, "Permission denied"))
    assert not space.is_full(BeamIOError("Delete operation failed", {"a": OSError(errno.ENOENT, "gone")}))
    assert not space.is_full(ValueError("bad input"))


def test_beams_log_of_a_full_disk_is_dropped_and_other_errors_stay(caplog):
    space.quiet_worker_logs()
    beam_log = logging.getLogger("apache_beam.runners.common")
    with caplog.at_level(logging.ERROR):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            beam_log.exception(exc)
        try:
            raise KeyError("a bug")
        except KeyError as exc:
            beam_log.exception(exc)
    assert [r.exc_info[0] for r in caplog.records] == [KeyError]
