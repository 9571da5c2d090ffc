"""Switching a living corpus to another model (docs/switching-models.md): the served view stays
exactly the corpus of each day in one model while the other model's view is built beside it
under the budget, the run that completes it switches `current/` in one step, and no
(model, text) is paid twice, switching back included."""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.cli import main
from pipeline.commands import run as run_command
from pipeline.outdir import OutputDir
from pipeline.outdir.space import free_bytes
from service.catalog import load_models
from service.tokenizer import get_encoding
from tests.conftest import SANDBOX_KEY, fill, make_free
from tests.e2e.money_helpers import (MODEL, corpus_rows, current, kill_once_journaled, ledger, start_sandbox, summary,
                                     write_corpus)
from tests.e2e.test_full_disk import to_free
from tests.e2e.helpers import assert_passages
from tests.e2e.test_sync import assert_current, chunk_hashes, glob_rows, next_day
from transforms.read.split import SplitConfig, Splitter

OTHER = "text-embedding-3-large"
THIRD = "text-embedding-ada-002"


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def write_models(path: Path) -> Path:
    """Small requests and short vectors for three models, with other chunk limits and prices, so
    that a switch splits the corpus anew and costs what its own model costs."""
    doc = {"models": {name: {k: v for k, v in dataclasses.asdict(m).items() if k != "name"}
                      for name, m in load_models().items()}}
    for name, limit, dims, price in ((MODEL, 512, 32, 100.0), (OTHER, 384, 48, 300.0), (THIRD, 512, 24, 50.0)):
        doc["models"][name].update(max_input_tokens=limit, max_inputs_per_request=4, max_tokens_per_request=1024,
                                   dimensions=dims, price_rub_per_1m_tokens=price)
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def run(corpus: Path, out: Path, sb, models: Path, model: str, *extra: str) -> int:
    return main(["run", "--input", str(corpus), "--output", str(out), "--model", model, "--base-url", sb.base_url,
                 "--models-config", str(models), *extra])


def plan(corpus: Path, out: Path, sb, models: Path, model: str, *extra: str, capsys) -> tuple[int, dict | None]:
    capsys.readouterr()
    code = main(["plan", "--input", str(corpus), "--output", str(out), "--model", model, "--base-url", sb.base_url,
                 "--models-config", str(models), "--json", *extra])
    text = capsys.readouterr().out
    return code, json.loads(text) if text.strip() else None


def billed_twice_per_model(charges: list[dict]) -> dict:
    counts = collections.Counter((c["model"], h) for c in charges for h in c["input_sha256"])
    return {k: n for k, n in counts.items() if n > 1}


def view_models(out: Path, folder: str) -> set[str]:
    return {m for f in (out / folder).glob("embeddings-*.parquet")
            for m in pq.read_table(f, columns=["model"]).column("model").to_pylist()}


def hashes_for(models: Path, rows: list[dict], model: str) -> dict[str, set]:
    text = models.read_text()
    swapped = yaml.safe_load(text)
    swapped["models"][MODEL] = swapped["models"][model]
    other = models.parent / f"as-{model}.yaml"
    other.write_text(yaml.safe_dump(swapped))
    return chunk_hashes(other, rows)


def header(capsys) -> str:
    """The first line of the short summary the last run printed."""
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("run "))


def test_a_switch_over_several_runs_serves_one_model_exactly_and_pays_each_text_once(
        tmp_path, sandbox_factory, env_key, capsys, caplog):
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    day = corpus_rows(n_short=60, n_long=3)
    corpus, out = write_corpus(tmp_path / "corpus.parquet", day), tmp_path / "out"
    assert run(corpus, out, sb, models, MODEL) == 0

    # another model without the flag: refused by run and plan alike, naming the flag
    assert run(corpus, out, sb, models, OTHER, "--sync") == 2
    assert plan(corpus, out, sb, models, OTHER, "--sync", capsys=capsys)[0] == 2

    code, planned = plan(corpus, out, sb, models, OTHER, "--sync", "--switch-model", capsys=capsys)
    assert code == 0 and planned["switch"]["to"]["model"] == OTHER
    per_run = planned["target"]["estimated_cost_rub"] / 2.5   # at least three runs
    runs = 0
    while True:
        runs += 1
        assert runs < 8
        day, _ = next_day(day, seed=runs, edit_short=2, edit_long=1, remove=1, add=2)
        write_corpus(corpus, day)
        caplog.clear()
        code = run(corpus, out, sb, models, OTHER, "--sync", "--switch-model", "--allow-partial",
                   "--max-spend-rub", f"{per_run:.6f}")
        s = summary(out)
        assert billed_twice_per_model(ledger(sb)) == {}
        if code == 0:
            break
        assert code == 4 and not s["switch"]["switched"]
        assert f"({MODEL}, switching to {OTHER}): " in header(capsys)
        # an expected stop: the advice is logged as what it is, nothing at ERROR
        advice = [r for r in caplog.records if "is not complete" in r.getMessage()]
        assert [r.levelno for r in advice] == [logging.INFO] and not [r for r in caplog.records
                                                                     if r.levelno >= logging.ERROR]
        # the served view is exactly the day's corpus, in the served model only
        assert_current(out, models, day)
        assert view_models(out, "current") == {MODEL}
        assert view_models(out, "target") <= {OTHER}
        assert 0 <= s["switch"]["documents_done"] < s["switch"]["documents_total"] == len({r["id"] for r in day})
        assert s["switch"]["spent_rub"] > 0 and s["switch"]["estimated_rub_to_finish"] > 0
    assert runs >= 3
    assert s["switch"]["switched"] and s["model"] == MODEL and s["switch"]["to"]["model"] == OTHER
    assert header(capsys).endswith(f"({OTHER}, switched from {MODEL}): done (exit 0)")   # what current/ serves
    assert view_models(out, "current") == {OTHER} and not (out / "target").exists()
    served = collections.defaultdict(set)
    for r in current(out, "embeddings").to_pylist():
        served[r["doc_id"]].add(r["text_sha256"])
    assert served == hashes_for(models, day, OTHER)

    # what the target cost is what its distinct texts cost, to the micro-rouble per request
    spent = sum(c["cost_rub"] for c in ledger(sb) if c["model"] == OTHER)
    assert s["switch"]["spent_rub"] == pytest.approx(spent, abs=1e-6 * len(ledger(sb)))

    # the next day without the flag is a plain sync of the new model
    day, _ = next_day(day, seed=99, edit_short=1, edit_long=0, remove=1, add=1)
    write_corpus(corpus, day)
    assert run(corpus, out, sb, models, OTHER, "--sync") == 0
    # switching back to the model DIR served before pays only for texts it never had
    before = len(ledger(sb))
    code, back = plan(corpus, out, sb, models, MODEL, "--sync", "--switch-model", capsys=capsys)
    assert code == 0
    assert run(corpus, out, sb, models, MODEL, "--sync", "--switch-model") == 0
    new = ledger(sb)[before:]
    assert {c["model"] for c in new} <= {MODEL}
    assert billed_twice_per_model(ledger(sb)) == {}
    assert summary(out)["switch"]["switched"] and view_models(out, "current") == {MODEL}
    assert_current(out, models, day)
    # and back again at once: nothing changed, nothing sent
    before = len(ledger(sb))
    assert run(corpus, out, sb, models, OTHER, "--sync", "--switch-model") == 0
    assert len(ledger(sb)) == before and view_models(out, "current") == {OTHER}


def switch_day_one(tmp_path: Path, sandbox_factory, *sandbox_args: str):
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models, args=list(sandbox_args))
    day = corpus_rows(n_short=40, n_long=2)
    corpus, out = write_corpus(tmp_path / "corpus.parquet", day), tmp_path / "out"
    assert run(corpus, out, sb, models, MODEL) == 0
    return models, sb, corpus, out, day


def test_a_key_that_may_not_use_the_target_keeps_the_served_view_and_loses_nothing(tmp_path, sandbox_factory,
                                                                                   env_key, caplog):
    models, sb, corpus, out, day = switch_day_one(tmp_path, sandbox_factory, "--key-models", MODEL)
    day, _ = next_day(day, seed=5, edit_short=2, edit_long=0, remove=1, add=2)
    write_corpus(corpus, day)
    paid = len(ledger(sb))
    assert run(corpus, out, sb, models, OTHER, "--sync", "--switch-model") == 1
    s = summary(out)
    assert_current(out, models, day)            # the day's changes reached the served view
    assert view_models(out, "current") == {MODEL} and {c["model"] for c in ledger(sb)[paid:]} == {MODEL}
    run_of_target = s["switch"]["run"]
    assert set(run_of_target["pending_reasons"]) == {"forbidden"} and run_of_target["embedded"] == 0
    # every chunk of the target is pending in its view, for the next run with a key that may
    assert run_of_target["pending"] == sum(len(v) for v in hashes_for(models, day, OTHER).values())
    assert "forbidden" in caplog.text and "model_not_allowed" in caplog.text
    assert not s["switch"]["switched"] and s["exit_code"] == 1


def test_a_third_model_abandons_the_switch_under_way_and_names_its_cost(tmp_path, sandbox_factory, env_key,
                                                                        caplog, capsys):
    models, sb, corpus, out, day = switch_day_one(tmp_path, sandbox_factory)
    _, planned = plan(corpus, out, sb, models, OTHER, "--sync", "--switch-model", capsys=capsys)
    half = planned["target"]["estimated_cost_rub"] / 2
    assert run(corpus, out, sb, models, OTHER, "--sync", "--switch-model", "--allow-partial",
               "--max-spend-rub", f"{half:.6f}") == 4
    spent = summary(out)["switch"]["spent_rub"]
    assert spent > 0 and (out / "target").is_symlink()
    code, compared = plan(corpus, out, sb, models, THIRD, "--sync", "--switch-model", capsys=capsys)
    assert code == 0 and compared["switch"]["to"]["model"] == THIRD   # plan only looks: nothing abandoned
    assert summary(out)["switch"]["to"]["model"] == OTHER

    assert run(corpus, out, sb, models, THIRD, "--sync", "--switch-model") == 0
    s = summary(out)
    gone = s["switch"]["abandoned"]
    assert gone == {"to": {"model": OTHER, "dimensions": 48, "chunk_tokens": 384, "overlap_tokens": 0},
                    "runs": gone["runs"], "spent_rub": spent}
    assert len(gone["runs"]) == 1
    assert f"{spent:.6f} RUB" in caplog.text and "abandoned" in caplog.text
    assert s["switch"]["switched"] and view_models(out, "current") == {THIRD}
    # the abandoned model's vectors stay: switching to it now pays only what it lacked
    assert run(corpus, out, sb, models, OTHER, "--sync", "--switch-model") == 0
    assert billed_twice_per_model(ledger(sb)) == {} and view_models(out, "current") == {OTHER}
    assert_current_as(out, models, day, OTHER)


def assert_current_as(out: Path, models: Path, rows: list[dict], model: str) -> None:
    served = collections.defaultdict(set)
    for r in current(out, "embeddings").to_pylist():
        served[r["doc_id"]].add(r["text_sha256"])
    assert served == hashes_for(models, rows, model)
    assert_passages(out, {r["id"]: r["text"] for r in rows})


def hashes_at(rows: list[dict], chunk_tokens: int) -> dict[str, set]:
    splitter = Splitter(get_encoding(), SplitConfig(max_tokens=chunk_tokens))
    return {r["id"]: {c.text_sha256 for c in splitter.split(r["id"], r["text"])} for r in rows if r["text"]}


def served_hashes(out: Path, folder: str = "current") -> dict[str, set]:
    served = collections.defaultdict(set)
    for f in (out / folder).glob("embeddings-*.parquet"):
        for r in pq.read_table(f, columns=["doc_id", "text_sha256"]).to_pylist():
            served[r["doc_id"]].add(r["text_sha256"])
    return dict(served)


def test_other_chunk_tokens_are_a_switch_built_beside_the_served_view(tmp_path, sandbox_factory, env_key, capsys,
                                                                      caplog):
    """A DIR's chunking is part of its view, like its model: 64-token chunks are refused on a
    view of 512-token ones (naming the flags), and with --switch-model built beside it, paying
    only for chunk texts no store holds, until one run swaps them in."""
    models, sb, corpus, out, day = switch_day_one(tmp_path, sandbox_factory)
    day1_texts = set().union(*hashes_at(day, 512).values())
    assert run(corpus, out, sb, models, MODEL, "--sync", "--chunk-tokens", "64") == 2
    assert "--switch-model" in caplog.text and "512-token chunks (--chunk-tokens 512)" in caplog.text
    assert plan(corpus, out, sb, models, MODEL, "--sync", "--chunk-tokens", "64", capsys=capsys)[0] == 2
    assert run(corpus, out, sb, models, MODEL, "--sync", "--chunk-tokens", "600") == 2   # above the model's limit
    code, planned = plan(corpus, out, sb, models, MODEL, "--sync", "--switch-model", "--chunk-tokens", "64",
                         capsys=capsys)
    assert code == 0 and planned["switch"]["to"] == {"model": MODEL, "dimensions": 32, "chunk_tokens": 64,
                                                     "overlap_tokens": 0}
    assert planned["switch"]["from"]["chunk_tokens"] == 512
    before = len(ledger(sb))
    capsys.readouterr()
    assert run(corpus, out, sb, models, MODEL, "--sync", "--switch-model", "--chunk-tokens", "64",
               "--allow-partial", "--max-spend-rub", f"{planned['target']['estimated_cost_rub'] / 2:.6f}") == 4
    assert f"{MODEL} (512-token chunks) -> {MODEL} (64-token chunks): " in capsys.readouterr().out
    assert served_hashes(out) == hashes_at(day, 512)                  # readers still see the 512-token view
    target = served_hashes(out, "target")
    assert target and all(shas <= hashes_at(day, 64)[doc] for doc, shas in target.items())
    capsys.readouterr()
    assert run(corpus, out, sb, models, MODEL, "--sync", "--switch-model", "--chunk-tokens", "64") == 0
    assert f"({MODEL} (64-token chunks), switched from {MODEL} (512-token chunks)): done" in capsys.readouterr().out
    s = summary(out)
    assert s["switch"]["switched"] and served_hashes(out) == hashes_at(day, 64)
    assert all(r["n_tokens"] <= 64 for r in current(out, "embeddings").to_pylist())
    assert_passages(out, {r["id"]: r["text"] for r in day})
    charged = {h for c in ledger(sb)[before:] for h in c["input_sha256"]}
    assert charged == set().union(*hashes_at(day, 64).values()) - day1_texts   # short documents: not paid again
    assert billed_twice_per_model(ledger(sb)) == {}
    # the view is 64-token chunks now: the daily run says so, or is refused naming them
    before = len(ledger(sb))
    assert run(corpus, out, sb, models, MODEL, "--sync", "--chunk-tokens", "64") == 0 and len(ledger(sb)) == before
    caplog.clear()
    assert run(corpus, out, sb, models, MODEL, "--sync") == 2 and "--chunk-tokens 64" in caplog.text


def test_a_switch_killed_half_way_resumes_with_the_same_command(tmp_path, sandbox_factory, env_key):
    models, sb, corpus, out, day = switch_day_one(tmp_path, sandbox_factory)
    sb.stop()
    slow = start_sandbox(sandbox_factory, models, db=sb.db, args=["--latency-ms", "300"])
    served = sorted(f.name for f in (out / "current").iterdir())
    kill_once_journaled(corpus, out, slow, models, tmp_path / "job.log", 2, "--model", OTHER, "--sync",
                        "--switch-model")
    assert sorted(f.name for f in (out / "current").iterdir()) == served   # still the complete served view
    fast = start_sandbox(sandbox_factory, models, db=sb.db)
    assert run(corpus, out, fast, models, OTHER, "--sync", "--switch-model") == 0
    assert billed_twice_per_model(ledger(fast)) == {}
    assert summary(out)["switch"]["switched"] and len(summary(out)["switch"]["runs"]) == 2
    assert_current_as(out, models, day, OTHER)


def _target_failed(monkeypatch, caplog, where, *, before=None, after=None) -> str:
    """A switching `--sync` of WHERE (corpus, out, sandbox, models) whose second job (the
    target's) has BEFORE done before it starts or AFTER once it ran, and fails: exit 1, and its
    line, which says that the served part is committed."""
    corpus, out, sb, models = where
    real, calls = run_command._run_job, []

    def second_job(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2 and before:
            before()
        result = real(*args, **kwargs)
        if len(calls) == 2 and after:
            after()
        return result
    monkeypatch.setattr(run_command, "_run_job", second_job)
    caplog.clear()
    assert run(corpus, out, sb, models, OTHER, "--sync", "--switch-model") == 1
    line = next(r.getMessage() for r in caplog.records if "did not advance" in r.getMessage())
    assert "nothing is committed" not in line and f"{out} serves this run's changes, committed in its view of " \
        f"{MODEL};" in line, line
    return line


def test_an_input_changed_during_the_targets_part_says_the_served_part_is_committed(tmp_path, sandbox_factory,
                                                                                  env_key, monkeypatch, caplog):
    """The served view's share of the day is committed first; the input changes while the
    target's job reads it: the target is not committed, and the line says so, not that
    nothing is committed. The same command, once the input is whole, completes the switch."""
    models, sb, corpus, out, day = switch_day_one(tmp_path, sandbox_factory)
    today, _ = next_day(day, seed=5, edit_short=2, edit_long=0, remove=1, add=2)
    write_corpus(corpus, today)
    later, _ = next_day(today, seed=6, edit_short=2, edit_long=0, remove=0, add=1)
    line = _target_failed(monkeypatch, caplog, (corpus, out, sb, models), after=lambda: write_corpus(corpus, later))
    assert f"the input file {corpus} changed while the run read it" in line
    assert f"the view of {OTHER} beside it stays as it was before this run" in line
    assert_current(out, models, today)           # the served part is committed: the day as first read
    assert not summary(out)["switch"]["switched"] and summary(out)["exit_code"] == 1
    assert not (out / "target").exists()          # the target had no view before this run, and has none
    monkeypatch.undo()
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    assert run(corpus, out, sb, models, OTHER, "--sync", "--switch-model") == 0
    assert summary(out)["switch"]["switched"] and billed_twice_per_model(ledger(sb)) == {}
    assert_current_as(out, models, later, OTHER)


def test_a_full_disk_during_the_targets_part_says_what_to_free_and_the_same_command_completes(
        tmp_path, disk, sandbox_factory, env_key, monkeypatch, caplog):
    """The served view's share of the day is committed; the disk fills before the target's job:
    the line says the served part is committed, what to free, and freeing it lets the same
    command complete the switch."""
    mount = disk(8)
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    day = corpus_rows(n_short=40, n_long=2)
    corpus, out = write_corpus(tmp_path / "corpus.parquet", day), mount / "out"
    assert run(corpus, out, sb, models, MODEL) == 0
    today, _ = next_day(day, seed=5, edit_short=2, edit_long=0, remove=1, add=2)
    write_corpus(corpus, today)
    filler = []
    line = _target_failed(monkeypatch, caplog, (corpus, out, sb, models),
                          before=lambda: filler.append(fill(mount, 64 << 10)))
    assert f"--output {out}: no space left on its disk" in line
    # as a reader of current/ sees it: summary.json stays the last run's when even it found no room
    served = collections.defaultdict(list)
    for r in glob_rows(out).to_pylist():
        served[r["doc_id"]].append(r["text_sha256"])
    assert {d: set(h) for d, h in served.items()} == chunk_hashes(models, today)
    assert all(len(h) == len(set(h)) for h in served.values())
    monkeypatch.undo()
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    make_free(mount, filler[0], free_bytes(mount) + to_free(line))
    assert run(corpus, out, sb, models, OTHER, "--sync", "--switch-model") == 0
    assert summary(out)["switch"]["switched"] and billed_twice_per_model(ledger(sb)) == {}
    assert_current_as(out, models, today, OTHER)


def test_switch_model_goes_with_sync(tmp_path, sandbox_factory, env_key, caplog):
    models, sb, corpus, out, _ = switch_day_one(tmp_path, sandbox_factory)
    assert run(corpus, out, sb, models, OTHER, "--resume", "--switch-model") == 2
    assert "--switch-model goes with --sync" in caplog.text
    # the served model with the flag and no switch under way is a plain sync
    assert run(corpus, out, sb, models, MODEL, "--sync", "--switch-model") == 0
    assert "switch" not in summary(out)


def test_compare_shows_the_neighbours_the_two_models_share(tmp_path, sandbox_factory, env_key, capsys):
    models, sb, corpus, out, _ = switch_day_one(tmp_path, sandbox_factory)
    assert main(["compare", str(out)]) == 2                         # no switch under way
    _, planned = plan(corpus, out, sb, models, OTHER, "--sync", "--switch-model", capsys=capsys)
    assert run(corpus, out, sb, models, OTHER, "--sync", "--switch-model", "--allow-partial",
               "--max-spend-rub", f"{planned['target']['estimated_cost_rub'] * 0.7:.6f}") == 4
    paid = len(ledger(sb))
    capsys.readouterr()
    assert main(["compare", str(out), "--json", "--k", "5", "--sample", "20"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert len(ledger(sb)) == paid                                   # nothing paid
    assert r["from"] == MODEL and r["to"] == OTHER and r["sample"] == 20 and r["k"] == 5
    assert r["chunks_in_both"] > 5 and sum(r["histogram"].values()) == 20
    assert 0 <= r["overlap"]["p10"] <= r["overlap"]["p50"] <= r["overlap"]["p90"] <= 1
    assert r["spent_rub"] == summary(out)["switch"]["spent_rub"]
    assert main(["compare", str(out)]) == 0 and "nearest neighbours" in capsys.readouterr().out


@pytest.mark.soak   # slow: make soak
def test_a_switch_on_an_object_store_serves_its_views_by_their_manifests(tmp_path, sandbox_factory, env_key,
                                                                         monkeypatch):
    """No links on S3: the current view is `_current.json`, the target's `_target.json`; the switch
    replaces the first with the second and removes the target's."""
    from tests.e2e.test_object_stores import BUCKET, S3, mirror
    store = S3(monkeypatch)
    try:
        models = write_models(tmp_path / "models.yaml")
        sb = start_sandbox(sandbox_factory, models)
        day = corpus_rows(n_short=20, n_long=1)
        corpus = store.put(write_corpus(tmp_path / "corpus.parquet", day), "in/corpus.parquet")
        out = f"s3://{BUCKET}/out"
        assert run(corpus, out, sb, models, MODEL, *store.flags) == 0
        assert run(corpus, out, sb, models, OTHER, "--sync", "--switch-model", "--allow-partial",
                   "--max-spend-rub", "0.05", *store.flags) == 4
        local = mirror(store, "out/", tmp_path / "partial")
        target = json.loads((local / "_target.json").read_text())
        assert target["model"] == OTHER and json.loads((local / "_current.json").read_text())["model"] == MODEL
        assert run(corpus, out, sb, models, OTHER, "--sync", "--switch-model", *store.flags) == 0
        local = mirror(store, "out/", tmp_path / "done")
        assert not (local / "_target.json").exists() and not (local / "_switch.json").exists()
        assert json.loads((local / "_current.json").read_text())["model"] == OTHER
        assert billed_twice_per_model(ledger(sb)) == {}
        assert_current_as(local, models, day, OTHER)
    finally:
        store.stop()


def test_a_switch_whose_served_part_stops_on_budget_prices_what_is_left_at_the_target_price(
        tmp_path, sandbox_factory, env_key):
    """The served view's share of the day stops on the budget: the target sent nothing this run,
    and its estimate to finish is the target's tokens at the target's price (300 RUB per 1M
    here, the served model's 100)."""
    models, sb, corpus, out, day = switch_day_one(tmp_path, sandbox_factory)
    day, _ = next_day(day, seed=3, edit_short=4, edit_long=1, remove=0, add=4)
    write_corpus(corpus, day)
    assert run(corpus, out, sb, models, OTHER, "--sync", "--switch-model", "--allow-partial",
               "--max-spend-rub", "0.001") == 4
    s = summary(out)
    assert s["pending"] > 0 and {c["model"] for c in ledger(sb)} == {MODEL}   # the target sent nothing
    view = OutputDir(str(out)).view
    tokens = sum(sum(pq.read_table(out / f, columns=["n_tokens"]).column("n_tokens").to_pylist())
                 for f in view.paths("embeddings"))
    # no target view yet: every document is priced at the served view's mean tokens
    expected = round(s["switch"]["documents_total"] * tokens / view.documents) * 300e-6
    assert s["switch"]["estimated_rub_to_finish"] == pytest.approx(expected, abs=1e-6)
