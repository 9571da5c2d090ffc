"""The job: options, settings, graph and CLI.

Importing Beam without its GCP extra logs "apitools not found..." on the root logger, a
warning about BigQuery that nobody asked for, and that call also configures the root logger
before the CLI can choose a format. Both entry points (`python -m pipeline`, the `embedpipe`
script) import this package first, so Beam is imported here once with only that line dropped.
"""
import logging


def _import_beam_quietly() -> None:
    root = logging.getLogger()
    placeholder = logging.NullHandler()  # a handler present: logging.warning() skips basicConfig()

    def drop(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("apitools not found")

    root.addHandler(placeholder)
    root.addFilter(drop)
    try:
        import apache_beam  # noqa: F401
    finally:
        root.removeFilter(drop)
        root.removeHandler(placeholder)


_import_beam_quietly()
