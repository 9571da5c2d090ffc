"""embedpipe command line: run, plan, demo, report, compare, publish, search, psql, beam-options.

    python -m pipeline run  --input GLOB --output DIR --model M --base-url URL [--json] [options]
    python -m pipeline plan --input GLOB --model M|all|A,B --base-url URL [--json]
    python -m pipeline demo [--workdir DIR]  the sandbox, a sample corpus, plan, run, a query, report
    python -m pipeline report DIR            the cost per model of DIR's view; DIR/report.png with [report]
    python -m pipeline compare DIR           during a switch: the two models' nearest neighbours
    python -m pipeline publish DIR --to TARGET [--table NAME]   a PostgreSQL table serves DIR's view
    python -m pipeline search DIR "text" [-k N] [--like DOC_ID] [--to TARGET --table NAME]
    python -m pipeline psql DIR [-c SQL]   psql on DIR's embedded database (publish --to embedded)
    python -m pipeline run --help            embedpipe's options, grouped (COMMAND --help: each command's)
    python -m pipeline beam-options          every Beam pipeline option (they all pass through)
    python -m pipeline --version             embedpipe's version, Beam's and Python's

User mistakes end in one clear message and an exit code, never a traceback.
"""
from __future__ import annotations

import atexit
import difflib
import importlib.metadata
import json
import logging
import os
import platform
import sys
import threading
from typing import Any, NoReturn

from pipeline.exits import EXIT_DOES_NOT_FIT, EXIT_FAILED, EXIT_OK, EXIT_USAGE, JobFailed, RunnerLost, UsageError
from pipeline.settings.job import catalogue, chunk_tokens_refusal, model_names, resolve
from pipeline.settings.options import EmbedPipeOptions, all_options_parser, command_options
from pipeline.terminal import OWN_LOGGERS
from pipeline.terminal import summary as short
from pipeline.terminal import usage
from service import errors
from service.catalog import ConfigError, get_model
from service.credentials import MissingApiKeyError
from service.tokenizer import TokenizerError
from transforms.read.split import MIN_MAX_TOKENS

log = logging.getLogger("embedpipe")

USAGE = __doc__
ON_SCREEN = "on_screen"   # a log record's flag: the screen already shows it, the console handler skips it
# Beam logs a worker's failure with its traceback; the driver reports the failed job in one line
# (pipeline/commands/run.py), so the traceback shows with --verbose only.
WORKER_FAILURES = "apache_beam.runners.common"
# A portable runner's own voice: Prism's log (its logger renames records PrismRunner and
# SdkWorker@ID, and raises their level to Prism's: a failed bundle is an ERROR with the worker's
# traceback), the runner's job messages (logged on the root logger by portable_runner), the
# start and stop of its job server, and LOOPBACK workers (threads of the launcher): their
# modules log each failed bundle's traceback, and their threads end in exceptions when the
# runner dies (BEAM_THREADS, which threading would print; logged as THREADS instead). The local
# runner says none of this; the one line of pipeline/checks/workers.py does; --verbose shows it
# all. Any other thread's end in an exception is printed as threading prints it.
RUNNER_VOICES = ("PrismRunner", "SdkWorker@", "apache_beam.runners.worker")
THREADS = "apache_beam.runners.worker.threads"
# the threads a LOOPBACK SDK harness (runners/worker/) and the portable runner's wait_until_finish
# start, by the names (or their starts) Beam gives them: each runs or reads a stream of the runner,
# which ends when it dies
BEAM_THREADS = ("run_worker_", "read_state", "read_grpc_client_inputs", "forward_grpc_outputs",
                "read_log_control_messages", "fn_api_status_handler", "lull_operation_logger", "wait_until_finish_")


def _runner_voice(record: logging.LogRecord) -> bool:
    return (record.name.startswith(RUNNER_VOICES) or record.module == "portable_runner"
            or (record.name == "apache_beam.utils.subprocess_server" and str(record.msg).startswith("Really ")))


def _thread_ended(args: threading.ExceptHookArgs) -> None:
    name = getattr(args.thread, "name", "")
    if not name.startswith(BEAM_THREADS):
        threading.__excepthook__(args)
        return
    logging.getLogger(THREADS).error("thread %s ended", name, exc_info=args.exc_value)


def _logging(verbose: bool) -> None:
    console = logging.StreamHandler(sys.stderr)
    console.addFilter(lambda record: not getattr(record, ON_SCREEN, False))
    if not verbose:
        console.addFilter(lambda record: record.name != WORKER_FAILURES and not _runner_voice(record))
    threading.excepthook = _thread_ended
    logging.basicConfig(level=logging.WARNING, handlers=[console],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)


def cmd_run(argv: list[str]) -> int:
    from pipeline.commands.run import execute
    job = resolve(command_options(argv), need_output=True)
    opts = job.opts
    if opts.publish or opts.publish_table:   # refused before anything is spent
        from pipeline.commands import publish
        publish.check_after_run(opts)

    def committed(code: int, report: dict[str, Any]) -> int:
        """The run's outcome, then (in DIR's lock) the publish of the view it committed."""
        next_step = short.advice(report, opts.output, job.again)
        if not opts.json:
            print("\n".join(short.lines(report, opts.output, next_step)), flush=True)
        if next_step:  # logged too, for logs and schedulers; a screen showing the summary has it already
            log.log(short.advice_level(report), next_step,
                    extra={ON_SCREEN: not opts.json and sys.stdout.isatty() and sys.stderr.isatty()})
        if opts.publish:   # the run's outcome stands, whatever the publish does
            from pipeline.commands.publish import after_run
            code = after_run(opts, code, report)
        return code

    code, report = execute(job, committed)
    if opts.json:
        print(json.dumps(report, indent=2, default=str))
    return code


def cmd_plan(argv: list[str]) -> int:
    from pipeline.commands.plan import plan, render
    opts = command_options(argv)
    if names := model_names(opts):
        return _plan_models(opts, names)
    result = plan(resolve(opts, need_output=False))
    print(json.dumps(result, indent=2) if opts.json else render(result))
    return EXIT_OK if result["fits"] else EXIT_DOES_NOT_FIT


def _plan_models(opts: EmbedPipeOptions, names: list[str]) -> int:
    """`plan --model all|a,b`: exit 0 when at least one model fits, 3 when none does. A model
    that cannot take --chunk-tokens is not planned, and does not fit; when none can, exit 2."""
    from pipeline.commands.plan import plan_models, render_comparison
    models = catalogue(opts)
    refused = {name: why for name in names if opts.chunk_tokens is not None
               and (why := chunk_tokens_refusal(opts.chunk_tokens, get_model(models, name))) is not None}
    if len(refused) == len(names):
        raise UsageError(f"--chunk-tokens {opts.chunk_tokens} fits none of the models: " + "; ".join(
            f"{name} takes {MIN_MAX_TOKENS} to {models[name].chunk_tokens}" for name in names))
    jobs = [resolve(opts, need_output=False, model_name=name) for name in names if name not in refused]
    planned = {p["model"]: p for p in plan_models(jobs)}
    results = [planned.get(name) or {"model": name, "fits": False, "not_planned": refused[name]} for name in names]
    print(json.dumps(results, indent=2) if opts.json else render_comparison(results, jobs))
    return EXIT_OK if any(r["fits"] for r in results) else EXIT_DOES_NOT_FIT


def cmd_beam_options(argv: list[str]) -> int:
    print(all_options_parser().format_help())
    return EXIT_OK


def cmd_demo(argv: list[str]) -> int:
    from pipeline.commands.demo import main as demo_main
    return demo_main(argv, cmd_plan, cmd_run)


def cmd_report(argv: list[str]) -> int:
    from pipeline.commands.report import main as report_main
    return report_main(argv)


def cmd_compare(argv: list[str]) -> int:
    from pipeline.commands.compare import main as compare_main
    return compare_main(argv)


def cmd_publish(argv: list[str]) -> int:
    from pipeline.commands.publish import main as publish_main
    return publish_main(argv)


def cmd_search(argv: list[str]) -> int:
    from pipeline.commands.search import main as search_main
    return search_main(argv)


def cmd_psql(argv: list[str]) -> int:
    from pipeline.commands.psql import main as psql_main
    return psql_main(argv)


COMMANDS = {"run": cmd_run, "plan": cmd_plan, "demo": cmd_demo, "report": cmd_report,
            "compare": cmd_compare, "publish": cmd_publish, "search": cmd_search,
            "psql": cmd_psql, "beam-options": cmd_beam_options}


HELP, VERSION = ("-h", "--help", "help"), ("-V", "--version")
EXIT_BROKEN_PIPE = 141   # as a shell reports a process that SIGPIPE ended


def version() -> str:
    """embedpipe's version (as installed), Beam's and Python's: what a bug report needs first."""
    import apache_beam
    try:
        own = importlib.metadata.version("embedpipe")
    except importlib.metadata.PackageNotFoundError:   # a checkout run without installing it
        own = "(not installed)"
    return f"embedpipe {own} (Apache Beam {apache_beam.__version__}, Python {platform.python_version()})"


def unknown_command(command: str) -> str:
    nearest = difflib.get_close_matches(command, COMMANDS, n=1)
    hint = f"did you mean '{nearest[0]}'?" if nearest else "the commands are " + ", ".join(COMMANDS)
    return f"unknown command '{command}': {hint} (python -m pipeline --help shows each)"


def entry() -> NoReturn:
    """The command's process: main's exit code; after a runner lost mid-job, with the output
    flushed and the exit handlers run but the interpreter not finalized (exits.RunnerLost)."""
    code = main()
    if not _RUNNER_LOST:
        sys.exit(code)
    logging.shutdown()
    atexit._run_exitfuncs()   # what a normal exit runs: Beam's stop of the runner's subprocesses
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


_RUNNER_LOST: list[bool] = []   # set by _main: how entry leaves


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:   # `embedpipe --help | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # Python's flush at exit fails too
        return EXIT_BROKEN_PIPE


def _main(argv: list[str]) -> int:
    if not argv:
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    if argv[0] in HELP and argv[1:2] and argv[1] in COMMANDS:   # `help run`: run's own
        argv = [argv[1], "--help"]
    elif argv[0] in HELP or argv[0] in VERSION:   # asked for: on stdout, exit 0 (`--help | less`)
        print(USAGE if argv[0] in HELP else version())
        return EXIT_OK
    verbose = "--verbose" in argv   # anywhere, before the command too
    _logging(verbose)
    argv = [a for a in argv if a != "--verbose"] or ["--verbose"]
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        log.error("%s", unknown_command(command))
        return EXIT_USAGE
    if command in ("run", "plan") and ({"-h", "--help"} & set(rest)):
        print(usage.render(command))
        return EXIT_OK
    try:
        return COMMANDS[command](rest)
    except (UsageError, ConfigError, MissingApiKeyError, TokenizerError) as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    except JobFailed as exc:
        log.error("%s", exc)
        if isinstance(exc, RunnerLost):
            _RUNNER_LOST.append(True)
        return EXIT_FAILED
    except errors.AuthenticationError as exc:
        log.error("the service refused the API key (%s): check EMBEDDINGS_API_KEY or --api-key-file",
                  exc.message)
        return EXIT_FAILED
    except errors.PermissionDeniedError as exc:
        log.error("the key may not do this (403: %s)", exc.message)
        return EXIT_FAILED
    except errors.EmbeddingsError as exc:
        log.error("the service could not be used: %s", exc)
        return EXIT_FAILED
    except KeyboardInterrupt:
        log.error("interrupted; run the same command again to continue, with --resume if it has neither "
                  "--resume nor --sync: nothing is paid twice")
        return EXIT_FAILED


if __name__ == "__main__":
    entry()
