"""`python -m pipeline publish DIR --to TARGET [--table NAME]`: NAME serves DIR's current view.

Beam's options pass through (--runner, --direct_num_workers, --profile ...): the workers
read the view's files and write the rows; the settings are configs/pipeline.yaml's `publish:`
(--run-config FILE for another).
"""
from __future__ import annotations

import argparse
import json
import logging

from pipeline.exits import EXIT_FAILED, EXIT_OK, JobFailed, UsageError
from pipeline.outdir import OutputDir
from pipeline.outdir.view import is_local
from pipeline.publish.publisher import publish
from pipeline.publish.target import DEFAULT_TABLE, EMBEDDED, parse_table, parse_url
from pipeline.settings.options import command_args
from pipeline.settings.steps import run_settings
from pipeline.terminal.figures import count

log = logging.getLogger("embedpipe")


def render(r: dict, output_dir: str) -> str:
    """One line of what was published, and one of what the view has that the table does not."""
    change = {"unchanged": "nothing to write", "built": "built", "rebuilt": "built beside and swapped in",
              "delta": "delta applied"}.get(r["action"], r["action"])
    lines = [f"published view {r['view']} ({r['model']}, {r['dimensions']:,} dimensions) to {r['table']} at "
             f"{r['target']}: {count(r['rows'], 'row')}; {change}, {count(r['written'], 'row')} written "
             f"(+{r['inserted']:,} ~{r['updated']:,} -{r['deleted']:,}) in {r['seconds_total']:.1f} s"]
    missing = [count(r[k], f"{k} chunk") for k in ("pending", "failed") if r[k]]
    if missing:
        lines.append(f"the view also has {' and '.join(missing)}, not in the table"
                     + (f": `python -m pipeline run --resume --output {output_dir} --model {r['model']} --base-url "
                        "URL` embeds the pending ones; publish again after it" if r["pending"] else ""))
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
    print(json.dumps(report, indent=2) if args.json else render(report, args.dir))
    return EXIT_OK


def check_after_run(opts) -> None:
    """`run --publish TARGET [--publish-table NAME]`: refused before the run when either is wrong."""
    if not opts.publish:
        raise UsageError("--publish-table goes with --publish TARGET")
    if opts.publish != EMBEDDED:
        parse_url(opts.publish, "--publish")
    elif not is_local(opts.output):
        raise UsageError(f"--publish embedded keeps its database in DIR/_postgres/, on a local disk; {opts.output} "
                         "is not one: give a postgresql:// URL")
    parse_table(opts.publish_table or DEFAULT_TABLE, "--publish-table")


def after_run(opts, code: int, report: dict) -> int:
    """The committed view published; summary.json gains `publish`. A failed publish is exit 1
    (when the run's own code is 0) with one line saying what to run."""
    out = OutputDir(opts.output)
    table = parse_table(opts.publish_table or DEFAULT_TABLE, "--publish-table")
    try:
        result = publish(out, opts.publish, table, run_settings(opts.run_config).publish, opts)
    except (JobFailed, UsageError) as exc:
        again = f"python -m pipeline publish {opts.output} --to {opts.publish}" + (
            f" --table {opts.publish_table}" if opts.publish_table else "")
        log.error("the view of %s is committed (run %s), but publishing it failed: %s. Publish it with: %s",
                  opts.output, report.get("run_id"), exc, again)
        report["publish"] = {"error": str(exc), "command": again}
        out.write_summary(report)
        return code or EXIT_FAILED
    report["publish"] = result
    out.write_summary(report)
    if not opts.json:
        print(render(result, opts.output))
    return code
