"""Command-line options of every command, as a Beam PipelineOptions subclass."""
from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from typing import Any, NoReturn, Protocol, TypeVar, cast

# Registers the Flink and Spark runners' options, so their flags count as known.
import apache_beam.runners.portability.flink_runner
import apache_beam.runners.portability.spark_runner  # noqa: F401
from apache_beam.internal import pickler
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions, _BeamArgumentParser
from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
from apache_beam.runners.runner import create_runner

from pipeline import prism
from pipeline.checks.reach import check_workers_reach_paths
from pipeline.exits import UsageError
from pipeline.settings import profiles

_Options = TypeVar("_Options", bound=PipelineOptions)


class _AddsArguments(Protocol):
    """What _add_argparse_args fills: Beam's parser, or the help's groups (pipeline/terminal/usage.py)."""
    def add_argument(self, *flags: str, **kwargs: Any) -> Any: ...


class _Parser(_BeamArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would print Beam's 100-line usage and exit
        raise UsageError(message)


def all_options_parser() -> _Parser:
    """Every option of every registered options class: the parser Beam builds in get_all_options."""
    parser = _Parser(allow_abbrev=False, add_help=False, usage="python -m pipeline run|plan [options]")
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    return parser


def unknown_flags(flags: list[str]) -> list[str]:
    """Flags no options class knows, each with a suggestion. Beam only warns about them, and a
    misspelt --max-spend-rub would then run without the cap the user asked for. A malformed
    value (--direct_num_workers abc) is a UsageError."""
    parser = all_options_parser()
    _, unknown = parser.parse_known_args(flags)
    known = [opt for action in parser._actions for opt in action.option_strings]
    found = []
    for arg in unknown:
        if arg.startswith("--"):
            name = arg.split("=", 1)[0]
            close = difflib.get_close_matches(name, known, n=1)
            found.append(name + (f" (did you mean {close[0]}?)" if close else ""))
        else:
            found.append(repr(arg))
    return found


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def split_flags(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """ARGV as (a command's own arguments, which PARSER reads; the flags it passes to Beam). A
    flag PARSER does not know goes to Beam's with the value Beam's option takes, so that
    `publish --profile prism DIR` never reads `prism` as DIR."""
    own = {opt: _takes_value(a) for a in parser._actions for opt in a.option_strings}
    beam = {opt: _takes_value(a) for a in all_options_parser()._actions for opt in a.option_strings}
    mine: list[str] = []
    flags: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if not arg.startswith("-") or name in own or arg == "-" or " " in name:   # a space: a value, as argparse reads it
            to, takes = mine, own.get(name, False)
        else:
            to, takes = flags, beam.get(name, False)
        width = 2 if takes and "=" not in arg else 1
        to.extend(argv[i:i + width])
        i += width
    return mine, flags


def command_options(flags: list[str], read_by_workers: Sequence[tuple[str, str]] = ()) -> EmbedPipeOptions:
    """Every command's options, from its flags after its profile's: refused (UsageError) when a
    flag is unknown, when Beam would refuse them once the job is built, or when a path its
    workers read (--input, --output, --known, and READ_BY_WORKERS: (name, path)) is on this
    machine for a runner whose workers run elsewhere, or when a worker pool on this machine is
    not this checkout's; Prism as `make prism` built it; the driver's filesystems set up as the
    workers' are."""
    flags = profiles.expand(flags)
    if unknown := unknown_flags(flags):
        raise UsageError(f"unknown option(s): {', '.join(unknown)}")
    opts = EmbedPipeOptions(flags)
    check_beam(opts)
    prism.use_build(opts)
    prism.own_pool(opts)
    check_workers_reach_paths(opts, read_by_workers)
    use_filesystems(opts)
    return opts


def command_args(parser: argparse.ArgumentParser, argv: list[str],
                 read_by_workers: Sequence[str] = ()) -> argparse.Namespace | int:
    """A small command's own arguments (PARSER's), with `options`: the command's options from
    the flags PARSER does not know (command_options; READ_BY_WORKERS: the names of its
    arguments that are paths its workers read). An int is argparse's exit code (it printed the
    usage or the help)."""
    parser.epilog = parser.epilog or "Beam's options pass through (--profile, --runner, --s3_endpoint_url, ...)."
    mine, beam_flags = split_flags(argv, parser)
    try:
        args, stray = parser.parse_known_args(mine)   # a stray value is reported with the unknown flags
    except SystemExit as exc:
        return int(exc.code or 0)
    paths = [(name.upper(), getattr(args, name)) for name in read_by_workers]
    args.options = command_options(beam_flags + stray, paths)
    return args


def use_filesystems(opts: PipelineOptions) -> None:
    """The driver's own file checks (input, output, resume, summary, report) go through
    FileSystems as the workers do; without the options, s3:// has no endpoint or keys."""
    FileSystems.set_options(opts)


def check_beam(opts: PipelineOptions) -> None:
    """What beam.Pipeline() checks first (the runner, the pickle library, Beam's validation of
    the options) would otherwise end in Beam's traceback once the job is built, after the input's
    scan and the account's reads."""
    name = opts.view_as(StandardOptions).runner
    try:
        runner = create_runner(name or "DirectRunner")
    except (ValueError, ImportError) as exc:
        raise UsageError(f"--runner {name}: {exc}") from None
    library = opts.view_as(SetupOptions).pickle_library
    try:
        pickler.set_library(library)
    except (ValueError, ImportError) as exc:
        raise UsageError(f"--pickle_library {library}: {exc}") from None
    if errors := PipelineOptionsValidator(opts, runner).validate():
        raise UsageError("Beam's options: " + " ".join(" ".join(e.split()) for e in errors))


class EmbedPipeOptions(PipelineOptions):
    def view_as(self, cls: type[_Options]) -> _Options:
        """One view per class, kept. Beam asks for a view twice per transform it applies (130
        times before the first request), and each new one parses the command line again: 40-58
        ms of the start. A view holds nothing of its own: its values live in the options' shared
        `_all_options`, so a kept one sees every change made through another."""
        views = self.__dict__.setdefault("_views", {})
        if cls not in views:
            views[cls] = super().view_as(cls)
        return cast(_Options, views[cls])   # made by super().view_as(cls)

    def __getstate__(self) -> dict[str, Any]:
        """A copy or a pickle makes its own views: kept ones would carry the values Beam's
        __getstate__ replaces (impersonate_service_account) into it."""
        state = dict(super().__getstate__())  # type: ignore[no-untyped-call]  # Beam's is unannotated
        state.pop("_views", None)
        return state

    @classmethod
    def _add_argparse_args(cls, parser: _AddsArguments) -> None:
        add = parser.add_argument
        add("--input", help="Parquet file, glob, directory or hive dataset (local, gs://, s3://)")
        add("--output", help="output directory")
        add("--model", help="model id from configs/models.yaml (plan: also all, or A,B)")
        add("--base_url", "--base-url", dest="base_url", help="service base URL ending in /v1")
        add("--max_spend_rub", "--max-spend-rub", dest="max_spend_rub", type=float, default=None,
            help="never spend more than this in one run")
        add("--daily_cap_rub", "--daily-cap-rub", dest="daily_cap_rub", type=float, default=None,
            help="the account's spending in the service's day (all clients) stays under this")
        add("--monthly_cap_rub", "--monthly-cap-rub", dest="monthly_cap_rub", type=float, default=None,
            help="the account's spending in the last 31 days (all clients) stays under this")
        add("--allow_partial", "--allow-partial", dest="allow_partial", action="store_true",
            help="when the estimate exceeds the budget, embed what fits and exit 4")
        add("--max_in_flight", "--max-in-flight", dest="max_in_flight", type=int, default=None,
            help="concurrent requests per worker (default from configs/pipeline.yaml)")
        add("--sync", action="store_true",
            help="the input is the whole corpus: --output becomes exactly it (edited documents "
                 "embedded again, removed ones leave); nothing is paid twice")
        add("--resume", action="store_true",
            help="bring the input's documents up to date in --output, keep the others; "
                 "without --input: send --output's pending rows")
        add("--switch_model", "--switch-model", dest="switch_model", action="store_true",
            help="with --sync: move --output to --model or chunks, beside the served view")
        add("--known", action="append", default=[],
            help="earlier runs' embeddings files whose vectors are reused (repeatable)")
        add("--dimensions", type=int, default=None, help="ask the service for shorter vectors")
        add("--id_column", "--id-column", dest="id_column", default="id", help="default: id")
        add("--text_column", "--text-column", dest="text_column", default="text", help="default: text")
        add("--keep_columns", "--keep-columns", dest="keep_columns", default="",
            help="comma-separated input columns carried to the outputs")
        add("--api_key_file", "--api-key-file", dest="api_key_file", default=None,
            help="read the API key from this file (else $EMBEDDINGS_API_KEY)")
        add("--api_key_secret", "--api-key-secret", dest="api_key_secret", default=None,
            help="secret manager version name, resolved on the workers")
        add("--account_segment", "--account-segment", dest="account_segment", default="service",
            help="path segment of the account endpoints (default: service)")
        add("--models_config", "--models-config", dest="models_config", default=None,
            help="model catalogue (default: the packaged configs/models.yaml)")
        add("--run_config", "--run-config", dest="run_config", default=None,
            help="run settings (default: the packaged configs/pipeline.yaml)")
        add("--chunk_tokens", "--chunk-tokens", dest="chunk_tokens", type=int, default=None,
            help="the longest chunk, in tokens (default: the model's limit)")
        add("--overlap_tokens", "--overlap-tokens", dest="overlap_tokens", type=int, default=None,
            help="tokens neighbouring chunks share (default from configs/pipeline.yaml)")
        add("--no_chunk_text", "--no-chunk-text", dest="no_chunk_text", action="store_true",
            help="leave each chunk's text out of the rows (output.chunk_text: false)")
        add("--doc_vectors", "--doc-vectors", dest="doc_vectors", action="store_true",
            help="also write one token-weighted mean vector per document")
        add("--publish", default=None,
            help="then a PostgreSQL table serves the view: embedded or postgresql://...")
        add("--publish_table", "--publish-table", dest="publish_table", default=None,
            help="the table --publish writes (default: embeddings)")
        add("--profile", default=None, help="configs/profiles/NAME.yaml (flags override it)")
        add("--json", dest="json", action="store_true", help="print JSON: one object, an array for several models")
