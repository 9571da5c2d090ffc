"""How a command ends: its exit codes, and the errors that end it with one message and no
traceback (pipeline/cli.py turns them into the code)."""

# the codes a run's pending rows give it, beside the reasons that give them
from transforms.pending import EXIT_DOES_NOT_FIT as EXIT_DOES_NOT_FIT
from transforms.pending import EXIT_FAILED as EXIT_FAILED
from transforms.pending import EXIT_PARTIAL as EXIT_PARTIAL

EXIT_OK, EXIT_USAGE = 0, 2


class UsageError(Exception):
    """A mistake in the command line or the input, found before spending (exit 2)."""


class JobFailed(Exception):
    """The Beam job itself failed (exit 1); the message says what to do."""


class RunnerLost(JobFailed):
    """The runner's process went away mid-job (exit 1). Threads of gRPC's that served its channels
    may still run when the interpreter finalizes, which aborts it (SIGABRT): the command's process
    ends without finalizing (pipeline/cli.py, entry)."""
