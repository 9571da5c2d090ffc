"""A full disk is recognised however it arrives: an OSError, inside Beam's batch file errors,
or as the text of a worker's error that the runner wrapped; nothing else is."""
from __future__ import annotations

import errno
import logging
import tempfile

from apache_beam.io.filesystem import BeamIOError

from pipeline.outdir import space


def test_a_full_disk_is_recognised_however_it_arrives():
    full = OSError(errno.ENOSPC, "No space left on device")
    assert space.is_full(full) and space.is_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert space.is_full(BeamIOError("Rename operation failed", {("a", "b"): full}))
    assert space.is_full(RuntimeError("OSError: [Errno 28] No space left on device [while running 'Write/Embeddings']"))
    assert space.is_full(RuntimeError("sqlite3.OperationalError: database or disk is full [while running 'Claim']"))
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


def test_a_full_disk_that_is_not_the_outputs_is_told_apart(tmp_path, disk, monkeypatch):
    """By the path the error gives (an OSError's file name, a worker's error as text), SQLite's
    full claim file as the temporary directory; without a path, DIR is the one unless it has
    room for what the command writes and the temporary directory is another disk."""
    out, temp = tmp_path / "out", disk(1)
    out.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    full = errno.ENOSPC, "No space left on device"
    on_temp = OSError(*full, str(temp / "gone" / "claims.sqlite"))
    assert space.other_disk(on_temp, str(out), None) == str(temp / "gone" / "claims.sqlite")
    as_text = RuntimeError(f"OSError: [Errno 28] No space left on device: '{temp}/x' [while running 'Write']")
    assert space.other_disk(as_text, str(out), None) == f"{temp}/x"
    assert space.other_disk(RuntimeError("sqlite3.OperationalError: database or disk is full"), str(out),
                            None) == str(temp)
    assert space.other_disk(OSError(*full, str(out / "history" / "f")), str(out), None) is None
    pathless = OSError(*full)
    assert space.other_disk(pathless, str(out), None) is None                       # no figure: DIR's
    assert space.other_disk(pathless, str(out), space.Needs(1 << 20, 0)) == str(temp)   # DIR has room
    assert space.other_disk(pathless, str(temp), space.Needs(1 << 40, 0)) is None       # DIR has not
    line = space.elsewhere(str(temp / "gone"), str(out), "the same command again")
    assert line.startswith(f"no space left on the temporary directory {temp}, ") and "MB free of 1.0 MB" in line
    assert f"not on --output {out}'s, " in line and "set TMPDIR" in line


def test_the_line_says_how_much_to_free_for_what_the_command_writes(disk):
    out = disk(2)
    needs = space.Needs(rows=3 << 20, rewrites=5 << 20)
    line = space.message(str(out), needs, "the same command again")
    free = space.free_bytes(str(out))
    more = -(-(needs.total - free) // (1 << 20))
    assert f"Free {more} MB more there (the same command writes up to {-(-needs.total // (1 << 20))} MB: its rows " \
           "and 5 MB of the view's files its commit writes again)" in line
    assert "Free space there" in space.message(str(out), None, "the same command again")
