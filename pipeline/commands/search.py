"""`python -m pipeline search DIR "text" [--mode hybrid|vector|text] [--where COLUMN=VALUE ...] [-k N]
[--like DOC_ID] [--to TARGET --table NAME] [--json]`: the published chunks that answer a text
(or the nearest to a document's first chunk), each with its passage.

A text query is searched by both legs by default, fused by reciprocal rank
(pipeline/publish/search.py): its vector, embedded through the service with the model and
length the table holds (its record, pipeline/publish/database.py), in one request that is paid
for: its cost is printed, and the request is kept as every run's are, a requests row in
DIR/history/<search>/ with a record in DIR/_runs/ (mode `search`), so DIR's reconciliation and
learned price account for it. The search holds DIR's lock meanwhile, as a run does: refused
while a run writes DIR. `--mode text` searches the passages' words alone and sends nothing;
`--like DOC_ID` compares with a vector the table has: neither pays nor writes anything. DIR must
hold a view (and, for `--to embedded`, the database `publish` made): a mistyped DIR is refused,
never made. `--where` is checked against the table before anything is paid.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import math
import shutil
import textwrap
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from psycopg import sql

from pipeline.commands.publish import publish_command
from pipeline.commands.snippet import ELLIPSIS, snippet, visible
from pipeline.exits import EXIT_OK, JobFailed, UsageError
from pipeline.outdir import OutputDir, layout, records, space
from pipeline.outdir.jsonfiles import write_whole
from pipeline.publish import checks, filters
from pipeline.publish import database as dbs
from pipeline.publish import search as found
from pipeline.publish.index import Index
from pipeline.publish.embedded import reach
from pipeline.publish.target import DEFAULT_TABLE, EMBEDDED, Database, TableName, parse_table
from pipeline.settings.config import RunSettings
from pipeline.settings.job import new_run_id
from pipeline.settings.options import EmbedPipeOptions, command_args
from pipeline.settings.steps import catalogue, run_settings, service_config
from pipeline.terminal import hints
from pipeline.terminal.figures import exact
from service import errors
from service.catalog import ModelSpec, get_model
from service.client import check_base_url
from service.credentials import KeySource
from service.tokenizer import ENCODING_NAME, get_encoding
from transforms import schemas
from transforms.embed.send import request_key
from transforms.errors import one_line
from transforms.publish.columns import CONTRACT
from transforms.publish.load import connect
from transforms.records import TextItem

log = logging.getLogger("embedpipe")

SEARCH_AGAIN = "search again"   # the lock's advice: a search refused while a run writes DIR
PASSAGE = ("chunk_id", "text", "text_tsv")   # what NAME holds for a search to show and fuse
CONTRACT_NAMES = {name for name, _ in CONTRACT} | set(PASSAGE)
INDENT = 7   # a passage's lines, under its hit's
KEPT_SHOWN = 40   # characters of a kept value on a hit's line
QUERY_SHOWN = 80   # characters of the query on the header line (--json has it whole)


def _record_request(out: OutputDir, search_id: str, row: dict[str, Any], balance_before: float | None,
                    base_url: str) -> str:
    """The query's request as a run's: history/<search>/requests-*.parquet (written whole, then
    renamed: a later commit and the reconciliation read every such file) and _runs/<search>.json."""
    records.record_start(out.path, search_id, row["model"], records.SEARCH, {"balance": balance_before},
                         hints.remembered(base_url))
    path = out.join(f"{layout.run_dir(search_id)}/requests-{search_id}-search.parquet")
    write_whole(path, lambda sink: pq.write_table(pa.Table.from_pylist([row], schema=schemas.REQUESTS), sink))
    records.record_finish(out.path, search_id, {"balance": row["balance_after"]}, [])
    return path


def embed_query(out: OutputDir, text: str, model: str, dimensions: int, opts: EmbedPipeOptions,
                settings: RunSettings) -> tuple[str, dict[str, Any]]:
    """TEXT's vector as an SQL literal of pgvector, and its request row, recorded in DIR while
    the search holds DIR's lock (a run writing DIR refuses it before anything is paid)."""
    spec = get_model(catalogue(opts.models_config), model)
    _check_length(text, spec)
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
                try:
                    result = client.embed(model, [text], dimensions=asked, request_id=request_id)
                except errors.NotFoundError as exc:   # not billed: a mistyped --base-url
                    raise hints.not_found(client, exc) from None
            usage = result.usage
            row = {"request_id": request_id, "model": model, "n_inputs": 1, "prompt_tokens": usage.prompt_tokens,
                   "total_tokens": usage.total_tokens, "cost_rub": usage.cost_rub or 0.0,
                   "balance_after": usage.balance, "attempts": result.attempts, "latency_ms": result.latency_ms,
                   "status": result.status, "started_at": started, "run_id": search_id}
            before = None if usage.balance is None else usage.balance + (usage.cost_rub or 0.0)
            row["recorded_in"] = out.relative(_record_request(out, search_id, row, before, service.base_url))
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


def _check_length(text: str, spec: ModelSpec) -> None:
    """UsageError for a query longer than one input of SPEC's model, counted as the run counts
    its chunks: the service would refuse it (unbilled, but in a traceback-shaped HTTP 400)."""
    tokens = len(get_encoding().encode_ordinary(text))
    if tokens > spec.chunk_tokens:
        raise UsageError(f"the text to search for is {tokens:,} tokens ({ENCODING_NAME}, as a run counts), more than "
                         f"the {spec.chunk_tokens:,} one input of {spec.name} takes: shorten it, or search its words "
                         "alone with --mode text (nothing sent)")


def search(args: argparse.Namespace) -> dict[str, Any]:
    opts: EmbedPipeOptions = args.options
    out = OutputDir(args.dir)
    out.require_view()   # a mistyped DIR: refused, nothing made in it
    table = parse_table(args.table)
    settings = run_settings(opts.run_config)
    notes: list[str] = []
    with reach(args.to, out.path) as db:
        try:
            conn = connect(db.url, settings.publish.connect_timeout_s, "search")
        except psycopg.OperationalError as exc:
            raise JobFailed(f"could not connect to the database at {db.shown}: {one_line(exc)}") from None
        try:
            names, record, kept, config = _published(conn, db, table, args, opts)
            given = filters.resolve(conn, names, args.where)   # before anything is paid
            words = None if args.mode == "vector" else args.text
            if words is not None and not found.words_searchable(conn, config, words):
                notes.append(f"no word of the query is left to search the text for (only punctuation, or words "
                             f"the text search configuration {config} leaves out): "
                             + ("nothing found" if args.mode == "text" else "the vector leg's ranking alone"))
                words = None
            vector, params, request = _query_vector(conn, names, record, args, out, settings)
            query = found.Query(args.k, vector, words, config, given, args.like)
            rows = [] if vector is None and words is None else found.run(
                conn, names, Index(record.dimensions), kept, query, params, settings.publish, settings.search)
            hits = [_hit(row, kept) for row in rows]
            # the text leg never matches a row without text: count those (a scan of NAME, ~80 ms
            # on 200,000 rows) where they may be why it found fewer than k, or where one is shown
            short = words is not None and sum(h["text_rank"] is not None for h in hits) < args.k
            lacking = _without_text(conn, names) if short or any(not h["text"] for h in hits) else 0
        except psycopg.Error as exc:
            raise JobFailed(f"searching {table.name} at {db.shown} failed: {one_line(exc)}") from None
        finally:
            conn.close()
    if lacking:
        notes.append(f"{lacking:,} of {names.qualified}'s rows have no text, shown empty: their view was written "
                     "without it (output.chunk_text: false, or before texts were kept); a `run --sync` that keeps "
                     "texts gives them theirs at no cost, and the next publish carries them")
    return {"table": names.qualified, "view": record.view, "model": record.model, "mode": args.mode,
            "query": args.like or args.text, "where": list(args.where),
            "text_search_config": config,
            "rrf_k": settings.search.rrf_k if args.mode == "hybrid" and words is not None else None,   # None: not fused
            "request": request, "notes": notes, "rows_without_text": lacking, "results": hits}


def _query_vector(conn: psycopg.Connection, names: dbs.Names, record: dbs.Record, args: argparse.Namespace,
                  out: OutputDir, settings: RunSettings) -> tuple[sql.Composable | None, dict[str, Any],
                                                                 dict[str, Any] | None]:
    """The vector leg's query: an SQL expression of its vector, its parameters, and the paid
    request's row (a text's, embedded now); None for --mode text."""
    if args.like is not None:
        if conn.execute(sql.SQL("SELECT 1 FROM {} WHERE doc_id = %s").format(names()), (args.like,)).fetchone() is None:
            raise UsageError(f"--like {args.like}: no chunk of that document in {names.qualified}")
        return (sql.SQL("SELECT embedding FROM {} WHERE doc_id = %(like)s ORDER BY chunk_index, token_start LIMIT 1")
                .format(names()), {"like": args.like}, None)
    if args.mode == "text":
        return None, {}, None
    literal, request = embed_query(out, args.text, record.model, record.dimensions, args.options, settings)
    return sql.SQL("%(query)s::vector({})").format(sql.Literal(record.dimensions)), {"query": literal}, request


def _published(conn: psycopg.Connection, db: Database, table: TableName, args: argparse.Namespace,
               opts: EmbedPipeOptions) -> tuple[dbs.Names, dbs.Record, list[str], str]:
    """NAME, its record, its kept columns and its text search configuration; UsageError when
    NAME is not a table embedpipe published, or one published before it kept the passages."""
    names = dbs.Names(dbs.schema_of(conn, db, table.schema), table.name)
    record = dbs.load_record(conn, names) if dbs.relkind(conn, names.schema, dbs.META) else None
    checks.check_ours(conn, names, record)
    again = publish_command(args.dir, args.to, args.table, opts)
    if record is None or dbs.relkind(conn, names.schema, names.name) is None:
        raise UsageError(f"{names.qualified} at {db.shown} is not a table embedpipe published: publish it "
                         f"first: {again}")
    have = filters.columns(conn, names)
    missing = [c for c in PASSAGE if c not in have]
    config = record.text_search
    if missing or not config:
        raise UsageError(f"{names.qualified} at {db.shown} was published without its passages' text search: publish "
                         f"it again, which adds it: {again}")
    kept = [name for name, _ in record.columns if name not in CONTRACT_NAMES and name in have]
    return names, record, kept, config


def _hit(row: tuple[Any, ...], kept: list[str]) -> dict[str, Any]:
    """A row of the search (its own fields, then the passage's, then the kept columns) as one
    hit: the kept columns under `kept`, whatever their names."""
    own = dict(zip(found.OWN, row, strict=False))
    shown = dict(zip(found.SHOWN, row[len(found.OWN):], strict=False))
    values = row[len(found.OWN) + len(found.SHOWN):]
    return {**shown, "score": round(float(own["score"]), 6),
            "vector_rank": own["vector_rank"], "vector_score": _rounded(own["vector_score"]),
            "text_rank": own["text_rank"], "text_score": _rounded(own["text_score"]),
            "kept": {name: _plain(v) for name, v in zip(kept, values, strict=True)}}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def _plain(value: object) -> object:
    """A kept value as JSON holds it: bytes as PostgreSQL's hex, NaN and infinities as text."""
    if isinstance(value, (bytes, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _without_text(conn: psycopg.Connection, names: dbs.Names) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE text = ''").format(names())).fetchone()
    return int(row[0]) if row else 0


def render(r: dict[str, Any]) -> str:
    lines = []
    if r["request"]:
        q = r["request"]
        lines.append(f"query embedded with {r['model']}: {q['prompt_tokens']:,} tokens, {exact(q['cost_rub'])} RUB "
                     f"(request {q['request_id']}, kept in {q['recorded_in']})")
    elif r["mode"] == "text":
        lines.append(f"full-text search of '{_shown(r['query'])}' in {r['table']} (configuration "
                     f"{r['text_search_config']}; nothing paid)")
    else:
        lines.append(f"chunks nearest to the first chunk of {_shown(r['query'])} (nothing paid)")
    fused = r["rrf_k"] is not None
    if fused:
        lines.append(f"{len(r['results'])} hits, vector and full-text legs fused by reciprocal rank (k = {r['rrf_k']}):")
    elif r["mode"] == "hybrid":
        lines.append(f"{len(r['results'])} hits, by the vector leg alone (no word of the query to search the text for):")
    width = max(40, shutil.get_terminal_size((100, 24)).columns - INDENT)
    words = None if r["mode"] == "vector" and not r["request"] else r["query"]   # --like: no words
    for n, hit in enumerate(r["results"], 1):
        legs = "  ".join(f"{leg} " + ("-" if hit[f"{leg}_rank"] is None else
                                      f"#{hit[f'{leg}_rank']} {hit[f'{leg}_score']:.3f}") for leg in ("vector", "text")
                         if r["mode"] in ("hybrid", leg))
        rrf = f"  rrf {hit['score']:.4f}" if fused else ""
        kept = "".join(f"  {visible(k)}={snippet(_text_of(v), None, KEPT_SHOWN)}" for k, v in hit["kept"].items())
        lines.append(f"{n:>3}  {visible(hit['doc_id'])}#{hit['chunk_index']}  tokens {hit['token_start']}-"
                     f"{hit['token_end']}{rrf}  {legs}{kept}")
        passage = snippet(hit["text"], words, 2 * width) if hit["text"] else "(no text)"
        lines += [" " * INDENT + line for line in textwrap.wrap(passage, width, max_lines=2, placeholder=ELLIPSIS)]
    return "\n".join(lines)


def _text_of(value: object) -> str:
    """A kept value as JSON reads it (a list, an object, true, null), a number, date or text as it is."""
    if isinstance(value, (list, dict, bool)) or value is None:
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def _shown(query: str) -> str:
    """QUERY on the header line: escaped, and shortened past QUERY_SHOWN characters."""
    return visible(query if len(query) <= QUERY_SHOWN else query[:QUERY_SHOWN - 1] + ELLIPSIS)


def _remembered(output_dir: str) -> str:
    """The base URL DIR's last run used, for a text query given none."""
    OutputDir(output_dir).require_view()   # a mistyped DIR: its own message
    if (url := records.last_base_url(output_dir)) is None:
        raise UsageError("a text query is embedded through the service: give --base-url URL (DIR's runs "
                         "recorded none), or --like DOC_ID, which pays nothing")
    log.info("the query goes to %s, the service of %s's last run (--base-url to choose another)", url, output_dir)
    return url


def _check_utf8(args: argparse.Namespace) -> None:
    """UsageError naming an argument that is not UTF-8 (Python holds its bytes as surrogates):
    the database and the service take UTF-8 alone."""
    given = [("the text to search for", args.text), ("--like", args.like), ("--table", args.table),
             *(("--where", w) for w in args.where), ("--to", args.to)]
    for name, value in given:
        try:
            (value or "").encode("utf-8")
        except UnicodeEncodeError:
            # --to's value may hold a password: named, never shown
            shown = "" if name == "--to" else " " + visible(
                str(value).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))
            raise UsageError(f"{name}{shown} is not valid UTF-8: give it in UTF-8 (a terminal or locale of another "
                             "encoding sends its own bytes)") from None


def query(argv: list[str]) -> tuple[argparse.Namespace, dict[str, Any]] | int:
    """The search ARGV asks for (the command's arguments): its arguments and report, or
    argparse's exit code (it printed the usage or the help)."""
    parser = argparse.ArgumentParser(prog="python -m pipeline search", allow_abbrev=False,
                                     description="the published chunks that answer a text, or nearest to a document")
    parser.add_argument("dir", help="the --output directory that was published")
    parser.add_argument("text", nargs="?", help="the query (its vector embedded with the table's model: paid)")
    parser.add_argument("--mode", choices=found.MODES, default=None,
                        help="hybrid (default for a text: both legs fused by reciprocal rank), vector, or text "
                             "(the passages' words alone: nothing paid, nothing sent)")
    parser.add_argument("--where", action="append", default=[], metavar="COLUMN=VALUE",
                        help="only chunks whose COLUMN (a kept or contract column) equals VALUE, typed as the column "
                             "is; repeatable: columns all apply, values of one column are alternatives")
    parser.add_argument("-k", type=int, default=10, help="how many chunks (default 10)")
    parser.add_argument("--like", metavar="DOC_ID", help="the chunks nearest to this document's first (free)")
    parser.add_argument("--to", default=EMBEDDED, help="as publish's (default embedded)")
    parser.add_argument("--table", default=DEFAULT_TABLE, help=f"as publish's (default {DEFAULT_TABLE})")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout (each passage whole)")
    parser.epilog = ("A text is embedded with run's --base-url (default: the one DIR's last run used), "
                     "--api-key-file (or --api-key-secret), --account-segment, --models-config; --run-config, "
                     "--profile and Beam's filesystem options pass through.")
    # `--` ends the options: the text after it may begin with `-` (websearch's "leave this word out")
    argv, after = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    try:
        args = command_args(parser, argv)
    except UsageError as exc:
        if str(exc).startswith("unknown option"):   # perhaps a query such as `-draft`
            raise UsageError(f"{exc} (a text to search for that begins with '-' goes after '--': "
                             "python -m pipeline search DIR [options] -- TEXT)") from None
        raise
    if isinstance(args, int):
        return args
    if after:
        if len(after) > 1 or args.text is not None:
            raise UsageError("give the text to search for once: after `--`, or before it, not both")
        args.text = after[0]
    _check_utf8(args)
    if (args.text is None) == (args.like is None):
        raise UsageError("give a text to search for, or --like DOC_ID (not both)")
    if args.like is not None and args.mode not in (None, "vector"):
        raise UsageError(f"--like compares vectors: --mode {args.mode} needs a text to search for")
    args.mode = args.mode or ("vector" if args.like is not None else "hybrid")
    if args.k < 1:
        raise UsageError("-k must be at least 1")
    if args.text is not None:
        if not args.text.strip():
            raise UsageError("the text to search for is empty")
        if "\x00" in args.text:
            raise UsageError("the text to search for holds a NUL character, which no PostgreSQL text holds")
    if args.text is not None and args.mode != "text":
        if not args.options.base_url:
            args.options.base_url = _remembered(args.dir)
        try:
            check_base_url(args.options.base_url)
        except ValueError as exc:
            raise UsageError(f"--base-url: {exc}") from None
    report = search(args)
    for note in report["notes"]:
        log.warning("%s", note)
    return args, report


def main(argv: list[str]) -> int:
    done = query(argv)
    if isinstance(done, int):
        return done
    args, report = done
    print(json.dumps(report, indent=2, default=str) if args.json else render(report))
    return EXIT_OK
