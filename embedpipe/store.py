"""The store of paid texts, for its owner: `compact_store(path)` merges its entries into large
files (safe while pipelines use it; a CLI output DIR is refused with a StoreError, nothing
touched); `python -m embedpipe.compact PATH [Beam options]` does the same from a shell or a
scheduler, e.g. after the daily pipeline. Layout and growth: transforms/dedupe/store.py and
docs/library.md."""
from __future__ import annotations

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.settings import steps
from transforms.dedupe.compaction import Compaction, compact


def compact_store(path: str, options: PipelineOptions | None = None, run_config: str | None = None) -> Compaction:
    """Merge PATH's entries (one per paid request) into one file per model and length; OPTIONS
    reach its filesystem (s3:// endpoint, region, ...) as a pipeline's do; RUN_CONFIG replaces
    configs/pipeline.yaml (store.compact_below_mb). A CLI output DIR: StoreError, nothing touched."""
    if options is not None:
        FileSystems.set_options(options)
    return compact(path, steps.run_settings(run_config).store.compact_below_mb << 20)
