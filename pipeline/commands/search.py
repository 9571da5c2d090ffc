"""`python -m pipeline search DIR "text" [-k N] [--like DOC_ID] [--to TARGET --table NAME]`:
the chunks of the published table nearest to a text, or to a document's first chunk.

The text is embedded through the service with the model and length the table holds (its
record, pipeline/publish/database.py), in one request that is paid for: its cost is printed,
and the request is kept as every run's are, a requests row in DIR/history/<search>/ with a
record in DIR/_runs/ (mode `search`), so DIR's reconciliation and learned price account for
it. The search holds DIR's lock meanwhile, as a run does: refused while a run writes DIR.
`--like DOC_ID` compares with a vector the table has: nothing is paid, nothing written. DIR
must hold a view (and, for `--to embedded`, the database `publish` made): a mistyped DIR is
refused, never made.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from psycopg import sql

from pipeline.commands.publish import publish_command
from pipeline.exits import EXIT_OK, JobFailed, UsageError
from pipeline.outdir import OutputDir, layout, records, space
from pipeline.outdir.jsonfiles import write_whole
from pipeline.publish import database as dbs
from pipeline.publish.target import DEFAULT_TABLE, EMBEDDED, parse_table, reach
from pipeline.settings.config import RunSettings
from pipeline.settings.job import new_run_id
from pipeline.settings.options import EmbedPipeOptions, command_args
from pipeline.settings.steps import catalogue, run_settings, service_config
from pipeline.terminal.figures import exact
from service.catalog import get_model
from service.client import check_base_url
from service.credentials import KeySource
from transforms import schemas
from transforms.embed.send import request_key
from transforms.errors import one_line
from transforms.publish.columns import CONTRACT
from transforms.records import TextItem

SEARCH_AGAIN = "search again"   # the lock's advice: a search refused while a run writes DIR


def _record_request(out: OutputDir, search_id: str, row: dict[str, Any], balance_before: float | None) -> str:
    """The query's request as a run's: history/<search>/requests-*.parquet (written whole, then
    renamed: a later commit and the reconciliation read every such file) and _runs/<search>.json."""
    records.record_start(out.path, search_id, row["model"], records.SEARCH, {"balance": balance_before})
    path = out.join(f"{layout.run_dir(search_id)}/requests-{search_id}-search.parquet")
    write_whole(path, lambda sink: pq.write_table(pa.Table.from_pylist([row], schema=schemas.REQUESTS), sink))
    records.record_finish(out.path, search_id, {"balance": row["balance_after"]}, [])
    return path


def embed_query(out: OutputDir, text: str, model: str, dimensions: int, opts: EmbedPipeOptions,
                settings: RunSettings) -> tuple[str, dict[str, Any]]:
    """TEXT's vector as an SQL literal of pgvector, and its request row, recorded in DIR while
    the search holds DIR's lock (a run writing DIR refuses it before anything is paid)."""
    spec = get_model(catalogue(opts.models_config), model)
    asked = None if spec.dimensions == dimensions else dimensions
    service = service_config(settings, spec, opts.base_url, opts.account_segment,
                             KeySource(file=opts.api_key_file, secret=opts.api_key_secret), asked)
    search_id = new_run_id()
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    request_id = request_key(search_id, model, asked, [TextItem(digest, text, 0, ())])
    row: dict[str, Any] | None = None
    try:
        with out.lock(search_id, settings.lock, again=SEARCH_AGAIN):
            started = dt.datetime.now(dt.UTC)
            with service.client(pool_size=1) as client:
                result = client.embed(model, [text], dimensions=asked, request_id=request_id)
            usage = result.usage
            row = {"request_id": request_id, "model": model, "n_inputs": 1, "prompt_tokens": usage.prompt_tokens,
                   "total_tokens": usage.total_tokens, "cost_rub": usage.cost_rub or 0.0,
                   "balance_after": usage.balance, "attempts": result.attempts, "latency_ms": result.latency_ms,
                   "status": result.status, "started_at": started, "run_id": search_id}
            before = None if usage.balance is None else usage.balance + (usage.cost_rub or 0.0)
            row["recorded_in"] = out.relative(_record_request(out, search_id, row, before))
    except OSError as exc:
        if not space.is_full(exc):
            raise
        paid = (f"the query's request {request_id} was paid ({exact(row['cost_rub'])} RUB) and is not kept there"
                if row else "nothing was paid")
        raise JobFailed(f"no space left on the disk of {out.path}: {paid}; free some space there") from None
    vector = result.vectors[0]
    if len(vector) != dimensions:
        raise JobFailed(f"the service answered a vector of {len(vector)} values where the table has {dimensions}")
    return "[" + ",".join(repr(float(x)) for x in vector) + "]", row


def search(args: argparse.Namespace) -> dict[str, Any]:
    opts: EmbedPipeOptions = args.options
    out = OutputDir(args.dir)
    out.require_view()   # a mistyped DIR: refused, nothing made in it
    table = parse_table(args.table)
    settings = run_settings(opts.run_config)
    with reach(args.to, out.path) as db:
        conn = dbs.connect(db, settings.publish)
        try:
            names = dbs.Names(dbs.schema_of(conn, db, table.schema), table.name)
            record = dbs.load_record(conn, names) if dbs.relkind(conn, names.schema, dbs.META) else None
            dbs.check_ours(conn, names, record)
            if record is None or dbs.relkind(conn, names.schema, names.name) is None:
                raise UsageError(f"{names.qualified} at {db.shown} is not a table embedpipe published: publish it "
                                 f"first: {publish_command(args.dir, args.to, args.table, opts)}")
            kept = [name for name, _ in record.columns[len(CONTRACT):]]
            request = None
            if args.like is not None:
                query = sql.SQL("SELECT embedding FROM {} WHERE doc_id = %(like)s ORDER BY chunk_index, token_start "
                                "LIMIT 1").format(names())
                params = {"like": args.like}
                if conn.execute(sql.SQL("SELECT 1 FROM {} WHERE doc_id = %s").format(names()),
                                (args.like,)).fetchone() is None:
                    raise UsageError(f"--like {args.like}: no chunk of that document in {names.qualified}")
            else:
                literal, request = embed_query(out, args.text, record.model, record.dimensions, opts, settings)
                query, params = sql.SQL("%(query)s::vector({})").format(sql.Literal(record.dimensions)), \
                    {"query": literal}
            rows = dbs.nearest(conn, names, record.dimensions, kept, query, params, args.k,
                               settings.publish.ef_search, exclude_doc=args.like)
        except psycopg.Error as exc:
            raise JobFailed(f"searching {table.name} at {db.shown} failed: {one_line(exc)}") from None
        finally:
            conn.close()
    return {"table": names.qualified, "view": record.view, "model": record.model, "query": args.like or args.text,
            "request": request, "results": [{**r, "similarity": round(float(r["similarity"]), 6)} for r in rows]}


def render(r: dict[str, Any]) -> str:
    lines = []
    if r["request"]:
        q = r["request"]
        lines.append(f"query embedded with {r['model']}: {q['prompt_tokens']:,} tokens, {exact(q['cost_rub'])} RUB "
                     f"(request {q['request_id']}, kept in {q['recorded_in']})")
    else:
        lines.append(f"chunks nearest to the first chunk of {r['query']} (nothing paid)")
    for row in r["results"]:
        extra = " ".join(f"{k}={v}" for k, v in row.items()
                         if k not in ("doc_id", "chunk_index", "token_start", "token_end", "similarity"))
        lines.append(f"  {row['similarity']:.3f}  {row['doc_id']}#{row['chunk_index']}  "
                     f"tokens {row['token_start']}-{row['token_end']}  {extra}".rstrip())
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline search", allow_abbrev=False,
                                     description="the published chunks nearest to a text or to a document")
    parser.add_argument("dir", help="the --output directory that was published")
    parser.add_argument("text", nargs="?", help="the query, embedded with the table's model (paid)")
    parser.add_argument("-k", type=int, default=10, help="how many chunks (default 10)")
    parser.add_argument("--like", metavar="DOC_ID", help="the chunks nearest to this document's first (free)")
    parser.add_argument("--to", default=EMBEDDED, help="as publish's (default embedded)")
    parser.add_argument("--table", default=DEFAULT_TABLE, help=f"as publish's (default {DEFAULT_TABLE})")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.epilog = ("A text is embedded with run's --base-url, --api-key-file (or --api-key-secret), "
                     "--account-segment, --models-config; --run-config, --profile and Beam's filesystem options "
                     "pass through.")
    args = command_args(parser, argv)
    if isinstance(args, int):
        return args
    if (args.text is None) == (args.like is None):
        raise UsageError("give a text to search for, or --like DOC_ID (not both)")
    if args.k < 1:
        raise UsageError("-k must be at least 1")
    if args.text is not None:
        if not args.text.strip():
            raise UsageError("the text to search for is empty")
        if not args.options.base_url:
            raise UsageError("a text query is embedded through the service: give --base-url URL (or --like DOC_ID, "
                             "which pays nothing)")
        try:
            check_base_url(args.options.base_url)
        except ValueError as exc:
            raise UsageError(f"--base-url: {exc}") from None
    report = search(args)
    print(json.dumps(report, indent=2, default=str) if args.json else render(report))
    return EXIT_OK
