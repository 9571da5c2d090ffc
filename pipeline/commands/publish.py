"""`python -m pipeline publish DIR --to TARGET [--table NAME]`: NAME serves DIR's current view.

Beam's options pass through (--runner, --direct_num_workers, --profile ...): the workers
read the view's files and write the rows; the settings are configs/pipeline.yaml's `publish:`
(--run-config FILE for another).
"""
from __future__ import annotations

import argparse
import json
import logging
import shlex

from pipeline.exits import EXIT_FAILED, EXIT_OK, JobFailed, UsageError
from pipeline.outdir import OutputDir
from pipeline.publish.publisher import publish
from pipeline.publish.target import DEFAULT_TABLE, check_target, parse_table
from pipeline.settings.options import command_args
from pipeline.settings.steps import catalogue, run_settings
from pipeline.terminal.figures import count
from transforms.errors import one_line

log = logging.getLogger("embedpipe")


def carried(opts) -> list[str]:
    """The flags a command given as advice carries from OPTS's: its settings and its profile."""
    return [a for flag, value in (("--run-config", opts.run_config), ("--profile", opts.profile)) if value
            for a in (flag, value)]


def publish_command(output_dir: str, target: str, table: str | None, opts) -> str:
    """The `publish` of DIR's view to TARGET, with OPTS's settings and profile, as a shell reads it."""
    argv = ["python", "-m", "pipeline", "publish", output_dir, "--to", target]
    return shlex.join(argv + (["--table", table] if table and table != DEFAULT_TABLE else []) + carried(opts))


def resume_command(opts, output_dir: str, r: dict) -> str | None:
    """The run that embeds the pending chunks of DIR's view (R: its publish's report), and
    publishes them when OPTS are a run's with --publish; None when the service's URL is not
    known here."""
    if not opts.base_url:
        return None
    argv = ["python", "-m", "pipeline", "run", "--resume", "--output", output_dir, "--model", r["model"],
            "--base-url", opts.base_url]
    spec = catalogue(opts.models_config).get(r["model"])
    argv += ["--dimensions", str(r["dimensions"])] if spec is None or spec.dimensions != r["dimensions"] else []
    for flag, value, default in (("--models-config", opts.models_config, None),
                                 ("--api-key-file", opts.api_key_file, None),
                                 ("--account-segment", opts.account_segment, "service")):
        argv += [flag, value] if value and value != default else []
    argv += carried(opts)
    if getattr(opts, "publish", None):
        argv += ["--publish", opts.publish] + (["--publish-table", opts.publish_table] if opts.publish_table else [])
    return shlex.join(argv)


def render(r: dict, resume: str | None) -> str:
    """One line of what was published, and one of what the view has that the table does not
    (RESUME: the command that embeds its pending chunks, when known)."""
    change = {"unchanged": "nothing to write", "built": "built", "rebuilt": "built beside and swapped in",
              "delta": "delta applied", "redefined": "defined again over the rows it holds"}.get(r["action"],
                                                                                                 r["action"])
    lines = [f"published view {r['view']} ({r['model']}, {r['dimensions']:,} dimensions) to {r['table']} at "
             f"{r['target']}: {count(r['rows'], 'row')}; {change}, {count(r['written'], 'row')} written "
             f"(+{r['inserted']:,} ~{r['updated']:,} -{r['deleted']:,}) in {r['seconds_total']:.1f} s"]
    missing = [count(r[k], f"{k} chunk") for k in ("pending", "failed") if r[k]]
    if missing:
        then = ("publishes them" if "--publish" in (resume or "") else "embeds them; publish again after it")
        lines.append(f"the view also has {' and '.join(missing)}, not in the table" + (
            "" if not r["pending"] else f": `{resume}` {then}" if resume else
            ": a run of DIR with --resume embeds the pending ones; publish again after it"))
    if r.get("without_text"):
        n = r["without_text"]
        lines.append(f"{n:,} of the view's {r['rows']:,} rows {'has' if n == 1 else 'have'} no text (written before "
                     "rows carried it, or with output.chunk_text: false): the table shows an empty text for them, "
                     "which text search does not find; a run of DIR with --sync, its text not left out, gives them "
                     "their text at no cost")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline publish", allow_abbrev=False,
                                     description="make a PostgreSQL table serve DIR's current view, exactly")
    parser.add_argument("dir", help="the --output directory of runs (local, gs://, s3://)")
    parser.add_argument("--to", dest="target", required=True,
                        help="`embedded` (DIR/_postgres/) or postgresql://[user@]host[:port]/db (no password: "
                             "PGPASSWORD, PGPASSFILE or ~/.pgpass)")
    parser.add_argument("--table", default=DEFAULT_TABLE, help=f"the table's name (default {DEFAULT_TABLE})")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.epilog = "Beam's options pass through (--runner, --direct_num_workers, --profile, --run-config ...)."
    args = command_args(parser, argv, read_by_workers=("dir",))
    if isinstance(args, int):
        return args
    opts = args.options
    table = parse_table(args.table)
    report = publish(OutputDir(args.dir), args.target, table, run_settings(opts.run_config).publish, opts)
    print(json.dumps(report, indent=2) if args.json else render(report, resume_command(opts, args.dir, report)))
    return EXIT_OK


def check_after_run(opts) -> None:
    """`run --publish TARGET [--publish-table NAME]`: refused before the run when either is wrong."""
    if not opts.publish:
        raise UsageError("--publish-table goes with --publish TARGET")
    check_target(opts.publish, opts.output, "--publish")
    parse_table(opts.publish_table or DEFAULT_TABLE, "--publish-table")


def after_run(opts, code: int, report: dict) -> int:
    """The view the run committed, published while the run still holds DIR's lock (no other run
    can commit another meanwhile); summary.json gains `publish`. A failed publish, whatever
    failed, is one line with the command that publishes the view, and exit 1 when the run's own
    code is 0."""
    out = OutputDir(opts.output)
    try:
        table = parse_table(opts.publish_table or DEFAULT_TABLE, "--publish-table")
        result = publish(out, opts.publish, table, run_settings(opts.run_config).publish, opts)
    except Exception as exc:   # the view is committed: the run's outcome stands, the publish is told
        again = publish_command(opts.output, opts.publish, opts.publish_table, opts)
        why = str(exc) if isinstance(exc, (JobFailed, UsageError)) else f"{type(exc).__name__}: {one_line(exc)}"
        log.error("the view of %s is committed (run %s), but publishing it failed: %s. Publish it with: %s",
                  opts.output, report.get("run_id"), why, again)
        log.debug("the publish's failure", exc_info=exc)   # --verbose: where
        report["publish"] = {"error": why, "command": again}
        out.write_summary(report)
        return code or EXIT_FAILED
    report["publish"] = result
    out.write_summary(report)
    if not opts.json:
        print(render(result, resume_command(opts, opts.output, result)))
    return code
