"""Running a user's pipeline around the library and collecting what came out of it."""
from __future__ import annotations

import pickle
from pathlib import Path

import apache_beam as beam
import yaml
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.runner import make_runner
from service.catalog import load_models

MODEL = "text-embedding-3-small"
MODEL_FIELDS = ("max_input_tokens", "tokenizer", "safety_factor", "max_inputs_per_request", "max_tokens_per_request",
                "dimensions", "supports_dimensions", "price_rub_per_1m_tokens")


def models_config(where: Path, **changed) -> str:
    """A catalogue file in WHERE holding MODEL as the shipped one has it, with CHANGED fields."""
    spec = load_models()[MODEL]
    path = where / "models.yaml"
    path.write_text(yaml.safe_dump({"models": {MODEL: {**{k: getattr(spec, k) for k in MODEL_FIELDS}, **changed}}}))
    return str(path)


def _dump(values, path: str) -> None:
    with open(path, "wb") as fh:
        pickle.dump(values, fh)


def collect(pcolls: dict, where: Path) -> None:
    """Each named PCollection into WHERE/<name>.pkl, whole (workers are local processes or threads)."""
    for name, pcoll in pcolls.items():
        (pcoll | f"Collect{name}" >> beam.combiners.ToList()
         | f"Dump{name}" >> beam.Map(_dump, str(where / f"{name}.pkl")))


def collected(where: Path, *names: str) -> dict:
    return {n: pickle.loads((where / f"{n}.pkl").read_bytes()) for n in names}


def run_pipeline(build, where: Path, *argv: str) -> beam.runners.runner.PipelineResult:
    """BUILD(p) returns the PCollections to collect; the local runner unless ARGV names another."""
    opts = PipelineOptions(list(argv))
    p = beam.Pipeline(runner=make_runner(opts), options=opts)
    collect(build(p), where)
    result = p.run()
    result.wait_until_finish()
    return result


def micro(rub: float) -> int:
    return round(rub * 1e6)
