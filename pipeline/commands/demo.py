"""`make run`: the whole job offline. Sandbox on a free loopback port, a real corpus (the
Python language reference that ships with Python, one document a topic, cut by the job into
passages of CHUNK_TOKENS), plan, run, the summary, the view published to the embedded
PostgreSQL, the passages nearest to the first one about the "for" statement found there in SQL,
each shown by its own text from the view, and the report's picture where matplotlib is installed."""
from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from collections.abc import Callable

import pyarrow.parquet as pq

from pipeline.commands import report
from pipeline.corpora.python_docs import write_python_docs_corpus
from service.sandbox.launcher import SandboxProcess

DEMO_KEY = "sk-demo-not-a-secret"
MODEL = "text-embedding-3-small"
QUERY_ID = "for"     # its first passage; the sandbox's vectors are lexical: passages that share its words come first
CHUNK_TOKENS = 300   # a passage a reader takes in at a glance; the model would take 8,191 (a whole topic)


# The query the demo ends with, as a psql user types it (docs/postgres.md). The HNSW index
# answers an ORDER BY distance to a constant or a scalar subquery (not to a joined column).
SQL = ("WITH q AS (SELECT embedding FROM embeddings WHERE doc_id = %(doc)s AND chunk_index = 0)\n"
       "SELECT doc_id, chunk_index, 1 - (embedding <=> (SELECT * FROM q)) AS similarity FROM embeddings\n"
       "WHERE doc_id <> %(doc)s ORDER BY embedding <=> (SELECT * FROM q) LIMIT %(k)s")


def nearest(output_dir: Path, doc_id: str, k: int = 5) -> list[tuple[float, str, int, str]]:
    """The K passages whose vectors are closest (cosine) to DOC_ID's first passage, of other
    documents, from the table `publish --to embedded` made: (score, id, chunk index, the
    passage's first line, from its text in the view)."""
    import psycopg

    from pipeline.publish.embedded import embedded
    with embedded(str(output_dir)) as db, psycopg.connect(db.url) as conn:
        found = conn.execute(SQL, {"doc": doc_id, "k": k}).fetchall()
    view = pq.read_table(sorted(str(p) for p in (output_dir / "current").glob("embeddings-*.parquet")),
                         columns=["doc_id", "chunk_index", "text"]).to_pylist()
    text = {(r["doc_id"], r["chunk_index"]): r["text"] for r in view}
    return [(float(score), found_id, index, _first_line(text[(found_id, index)]))
            for found_id, index, score in found]


def _first_line(passage: str) -> str:
    """The passage's first line with words, shortened to fit the screen."""
    line = next((line.strip() for line in passage.splitlines() if line.strip()), "")
    return line if len(line) <= 60 else line[:59].rstrip() + "…"


def main(argv: list[str], cmd_plan: Callable[[list[str]], int], cmd_run: Callable[[list[str]], int]) -> int:
    """The CLI's own plan and run commands are passed in (the CLI imports this module). One
    screen: the plan table, the run (its bar on a terminal, its short summary), the neighbours,
    the report picture."""
    ap = argparse.ArgumentParser(prog="python -m pipeline demo", description="the sandbox, a corpus (the Python "
                                 "language reference), plan, run, publish, a query and the report, offline")
    ap.add_argument("--workdir", default="demo", help="where the corpus, the sandbox's database and DIR go "
                                                      "(default ./demo; its out/ is made again)")
    args = ap.parse_args(argv)
    work = Path(_shown(Path(args.workdir)))
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.parquet"
    counts = write_python_docs_corpus(str(corpus))
    print(f"corpus   {corpus}: the Python language reference (pydoc_data.topics), {counts['topics']} topics, "
          f"cut into passages of at most {CHUNK_TOKENS} tokens")
    db = work / "sandbox.db"
    db.unlink(missing_ok=True)
    with SandboxProcess(db, key=DEMO_KEY, balance=100.0) as sandbox:
        print(f"sandbox  {sandbox.base_url} (a demo key, balance 100 RUB)")
        os.environ["EMBEDDINGS_API_KEY"] = DEMO_KEY
        common = ["--input", str(corpus), "--model", MODEL, "--base-url", sandbox.base_url,
                  "--chunk-tokens", str(CHUNK_TOKENS)]
        print("== plan ==")
        cmd_plan(common)
        print("== run ==", flush=True)   # before the run's log and bar on stderr
        code = cmd_run(common + ["--output", str(out), "--keep-columns", "topic", "--publish", "embedded"])
    print(f"== passages nearest to {QUERY_ID}'s first, in SQL (python -m pipeline psql {out}) ==")
    print("  " + (SQL % {"doc": f"'{QUERY_ID}'", "k": 5}).replace("\n", "\n  "))
    for score, doc_id, index, line in nearest(out, QUERY_ID):
        print(f"  {score:.3f}  {f'{doc_id} #{index}':<18}  {line}")
    print(f"report   {_picture(out)}")
    return code


def _picture(out: Path) -> str:
    """The report's picture of the run, or how to get it."""
    if not report.can_draw():
        return "a picture of the spending needs matplotlib: pip install -e '.[report]'"
    requests = report.load(report.current_files(str(out), "requests"), report.REQUEST_COLUMNS)
    return f"{report.write_picture(str(out), requests)} (spending over time, latency of each request)"


def _shown(path: Path) -> str:
    """PATH relative to the working directory when it is below it: shorter lines on the screen."""
    relative = os.path.relpath(path.resolve())
    return relative if not relative.startswith("..") else str(path.resolve())
