"""The library's settings come from the CLI's builder (pipeline/settings/steps.py): the exported
SplitConfig's defaults cut a text as the job does, for every model of the catalogue."""
from __future__ import annotations

from embedpipe import SplitConfig
from embedpipe._config import resolve
from pipeline.settings import steps
from service.credentials import KeySource


def test_the_exported_split_config_defaults_are_the_jobs():
    settings = steps.run_settings(None)
    for name, model in steps.catalogue(None).items():
        job = steps.split_config(settings, model)
        assert SplitConfig(max_tokens=model.chunk_tokens) == job
        assert resolve(name, "http://127.0.0.1:1/v1", KeySource()).split == job
