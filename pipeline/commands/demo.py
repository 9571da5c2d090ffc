"""`make run`: the whole job offline. Sandbox on a free loopback port, a real corpus (the
Python language reference that ships with Python, one document a topic, cut by the job into
passages of CHUNK_TOKENS), plan, run, the summary, the view published to the embedded
PostgreSQL, a question searched there by its words and its vector (`search`, hybrid), each
answer shown by its passage, and the report's picture where matplotlib is installed."""
from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from collections.abc import Callable

from pipeline.commands import report
from pipeline.corpora.python_docs import write_python_docs_corpus
from service.sandbox.launcher import SandboxProcess

DEMO_KEY = "sk-demo-not-a-secret"
MODEL = "text-embedding-3-small"
QUERY = "the break statement in a loop"   # words the passages use: the sandbox's vectors are lexical
CHUNK_TOKENS = 300   # a passage a reader takes in at a glance; the model would take 8,191 (a whole topic)
LEXICAL = ("the sandbox's vectors are lexical (hashed words and 3-grams): passages that share the query's "
           "words come first; a model's would also find those that say it in other words")
SHOWN = 62   # characters of each answer's passage on the screen


def answers(output_dir: Path, base_url: str, k: int = 5) -> list[tuple[float, str, int, str]]:
    """QUERY searched in the table `publish --to embedded` made, as `search` does (hybrid: its
    words and its vector, one request): (score, id, chunk index, the passage around the
    query's words)."""
    from pipeline.commands import search
    from pipeline.commands.snippet import snippet
    done = search.query([str(output_dir), QUERY, "-k", str(k), "--base-url", base_url])
    if isinstance(done, int):   # argparse refused the demo's own arguments
        raise RuntimeError(f"search's arguments refused (exit {done})")
    return [(hit["score"], hit["doc_id"], hit["chunk_index"], snippet(hit["text"], QUERY, SHOWN))
            for hit in done[1]["results"]]


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
        print(f"== search: python -m pipeline search {out} {QUERY!r} (its words and its vector) ==")
        print(f"  {LEXICAL}")
        for score, doc_id, index, passage in answers(out, sandbox.base_url):
            print(f"  {score:.4f}  {f'{doc_id} #{index}':<16}  {passage}")
    print(f"report   {_picture(out)}")
    return code


def _picture(out: Path) -> str:
    """The report's picture of the run, or how to get it."""
    if not report.can_draw():
        return "a picture of the spending needs matplotlib: make dev (pip install 'embedpipe[report]' elsewhere)"
    requests = report.load(report.current_files(str(out), "requests"), report.REQUEST_COLUMNS)
    return f"{report.write_picture(str(out), requests)} (spending over time, latency of each request)"


def _shown(path: Path) -> str:
    """PATH relative to the working directory when it is below it: shorter lines on the screen."""
    relative = os.path.relpath(path.resolve())
    return relative if not relative.startswith("..") else str(path.resolve())
