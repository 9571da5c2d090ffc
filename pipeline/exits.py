"""How a command ends: its exit codes, and the errors that end it with one message and no
traceback (pipeline/cli.py turns them into the code)."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_DOES_NOT_FIT, EXIT_PARTIAL = 0, 1, 2, 3, 4


class UsageError(Exception):
    """A mistake in the command line or the input, found before spending (exit 2)."""


class JobFailed(Exception):
    """The Beam job itself failed (exit 1); the message says what to do."""
