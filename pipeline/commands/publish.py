"""`python -m pipeline publish DIR --to TARGET [--table NAME]`: NAME serves DIR's current view.

Beam's options pass through (--runner, --direct_num_workers, --profile ...): the workers
read the view's files and write the rows; the settings are configs/pipeline.yaml's `publish:`
(--run-config FILE for another).
"""
from __future__ import annotations

import argparse
import json

from pipeline.exits import EXIT_OK, UsageError
from pipeline.outdir import OutputDir
from pipeline.publish.publisher import publish
from pipeline.publish.target import DEFAULT_TABLE, parse_table
from pipeline.settings import profiles
from pipeline.settings.options import EmbedPipeOptions, check_beam, unknown_flags, use_filesystems
from pipeline.settings.steps import run_settings
from pipeline.terminal.figures import count


def beam_options(flags: list[str]) -> EmbedPipeOptions:
    """A small command's Beam options (the pipeline it runs, the filesystems it reads)."""
    flags = profiles.expand(flags)
    if unknown := unknown_flags(flags):
        raise UsageError(f"unknown option(s): {', '.join(unknown)}")
    opts = EmbedPipeOptions(flags)
    check_beam(opts)
    use_filesystems(opts)
    return opts


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
    try:
        args, flags = parser.parse_known_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    table = parse_table(args.table)
    opts = beam_options(flags)
    report = publish(OutputDir(args.dir), args.target, table, run_settings(opts.run_config).publish, opts)
    print(json.dumps(report, indent=2) if args.json else render(report, args.dir))
    return EXIT_OK
