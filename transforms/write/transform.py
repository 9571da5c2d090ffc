"""Write: every output of a job as Parquet, into the run's own directory of DIR's history. File
names carry the run id: history/<run_id>/embeddings-<run_id>-00000-of-00002.parquet.

One composite writes all of a job's outputs: each output's writer is a DoFn fused into the
stage that produces its rows (one file per bundle, under a temporary name), and one finalising
step, after everything else, names the files. Beam's Write gives each output stages of its own
(initialise before the job, pre-finalise and finalise after it): for five outputs that was
~0.25 s of building the graph and ~0.3 s before the first request on the local runner.
The guarantees are those of Beam's file sinks: only the files of bundles the
runner committed reach the finalising step (a side input), so a retried bundle's file is never
named; a retried finalisation skips what it renamed already; the temporary files go at the end;
an output without rows still gets one empty file, so a glob reader finds its schema. Any
FileSystems scheme.
"""
from __future__ import annotations


import dataclasses
import logging
import uuid
from collections.abc import Mapping
from typing import BinaryIO

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import CompressionTypes, FileSystems
from apache_beam.transforms.window import GlobalWindows

from transforms.schemas import TEXT

log = logging.getLogger(__name__)

ROWS_PER_TABLE = 5000  # batching of small rows into Arrow tables; not a user-facing number
_MIME = "application/x-parquet"


@dataclasses.dataclass(frozen=True)
class Codec:
    """Parquet page compression: one codec for the scalar columns, one for the vectors.
    float32 vectors barely compress (zstd: ~7% smaller) and cost a reader ~2x the time to
    decode compressed, so they are written uncompressed unless configs/ say otherwise."""
    scalars: str = "zstd"
    vectors: str = "none"


def _is_vector(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_fixed_size_list(t)


def open_writer(sink, schema: pa.Schema, codec: Codec) -> pq.ParquetWriter:
    """Every output file's writer: no dictionary attempt and no min/max statistics on vectors
    (they never repeat and are never filtered on; these were a large share of writing them),
    nor on the chunks' texts (statistics would copy two whole texts into each row group's
    metadata, and a dictionary of distinct texts only costs its memory before it gives up)."""
    scalars = [f.name for f in schema if not _is_vector(f.type) and f.name != TEXT]
    compression = {f.name: codec.vectors if _is_vector(f.type) else codec.scalars for f in schema}
    return pq.ParquetWriter(sink, schema, compression=compression, use_dictionary=scalars,
                            write_statistics=scalars)


def _create(path: str) -> BinaryIO:
    return FileSystems.create(path, mime_type=_MIME, compression_type=CompressionTypes.UNCOMPRESSED)


@dataclasses.dataclass(frozen=True, eq=False)
class Output:
    """One output's files: `<kind>-<run>[-<part>]-NNNNN-of-NNNNN.parquet`. PART names a second
    set of files of a kind (`embeddings-<run>-reused-...`: on the local runner a Flatten is held
    in memory whole, so large outputs get files each instead). Elements are pyarrow Tables in
    SCHEMA, or with ROWS dicts (or NamedTuples) batched into tables here, EXTRA columns added."""
    kind: str
    schema: pa.Schema
    part: str | None = None
    rows: bool = False
    extra: Mapping | None = None

    def prefix(self, output_dir: str, run_id: str) -> str:
        return FileSystems.join(output_dir, f"{self.kind}-{run_id}" + (f"-{self.part}" if self.part else ""))

    def table(self, rows: list) -> pa.Table:
        extra = self.extra or {}
        dicts = [{**(r._asdict() if hasattr(r, "_asdict") else r), **extra} for r in rows]
        return pa.Table.from_pylist(dicts, schema=self.schema)


class _WriteBundles(beam.DoFn):
    """Each bundle's elements into one temporary file; (prefix, its path) once the bundle is done."""

    def __init__(self, output: Output, prefix: str, temp_dir: str, codec: Codec):
        self._output, self._prefix, self._temp_dir, self._codec = output, prefix, temp_dir, codec
        self._writer: tuple[pq.ParquetWriter, BinaryIO, str] | None = None   # (writer, its file, its path)

    def start_bundle(self):
        self._abandon()   # a failed bundle's file is never named; the finalising step deletes it
        self._rows: list = []

    def process(self, element):
        if not self._output.rows:
            self._write(element)
            return
        self._rows.append(element)
        if len(self._rows) >= ROWS_PER_TABLE:
            self._write(self._output.table(self._rows))
            self._rows = []

    def finish_bundle(self):
        if self._rows:
            self._write(self._output.table(self._rows))
        if self._writer is not None:
            writer, handle, path = self._writer
            self._writer = None
            try:
                writer.close()
                handle.close()
            except BaseException:
                writer.is_open = False   # its file is never named: no second footer when it is collected
                raise
            yield GlobalWindows.windowed_value((self._prefix, path))

    def teardown(self):
        self._abandon()

    def _write(self, table: pa.Table) -> None:
        if self._writer is None:
            path = FileSystems.join(self._temp_dir, f"{uuid.uuid4().hex}.parquet")
            handle = _create(path)
            self._writer = (open_writer(handle, self._output.schema, self._codec), handle, path)
        self._writer[0].write_table(table)

    def _abandon(self) -> None:
        """Drops a file never to be named, without its footer: a writer collected later would write
        one into the closed handle (a traceback on stderr), and a full disk could not take it."""
        if self._writer is not None:
            (writer, handle, _), self._writer = self._writer, None
            writer.is_open = False   # never named: no footer, now or when the writer is collected
            try:
                handle.close()
            except OSError:   # a full disk, say: the bundle's own error says it
                pass


class _NameFiles(beam.DoFn):
    """After the job: each output's temporary files get their final names, in a stable order;
    an output without any gets one empty file."""

    def __init__(self, outputs: Mapping[str, Output], temp_dir: str, codec: Codec):
        self._outputs, self._temp_dir, self._codec = dict(outputs), temp_dir, codec

    def process(self, _, written):
        by_prefix: dict[str, list[str]] = {prefix: [] for prefix in self._outputs}
        for prefix, path in written:
            by_prefix[prefix].append(path)
        existing = {m.path for r in FileSystems.match([FileSystems.join(self._temp_dir, "*")] +
                                                      [f"{p}-*-of-*.parquet" for p in by_prefix])
                    for m in r.metadata_list}
        for prefix, paths in by_prefix.items():
            if not paths:
                yield self._empty(prefix)
                continue
            for shard, src in enumerate(sorted(paths)):
                dst = f"{prefix}-{shard:05d}-of-{len(paths):05d}.parquet"
                if src in existing:
                    FileSystems.rename([src], [dst])
                elif dst not in existing:   # neither: not a retry of this step, a file lost
                    raise OSError(f"{src} was written and is gone, and {dst} does not exist")
                yield dst
        self._remove_temp_dir()

    def _empty(self, prefix: str) -> str:
        dst = f"{prefix}-00000-of-00001.parquet"
        handle = _create(dst)
        open_writer(handle, self._outputs[prefix].schema, self._codec).close()
        handle.close()
        return dst

    def _remove_temp_dir(self) -> None:
        """Files of failed bundles, and the directory itself where the filesystem has them."""
        left = [m.path for r in FileSystems.match([FileSystems.join(self._temp_dir, "*")]) for m in r.metadata_list]
        gone = left + ([self._temp_dir] if FileSystems.exists(self._temp_dir) else [])
        try:
            if gone:
                FileSystems.delete(gone)
        except OSError as exc:   # as Beam's sinks do: a leftover temporary file is not worth a failed job
            log.warning("could not remove the temporary files in %s: %s", self._temp_dir, exc)


class WriteOutputs(beam.PTransform):
    """{label: PCollection} -> the files of OUTPUTS[label] (the same labels) in OUTPUT_DIR;
    the final paths."""

    def __init__(self, output_dir: str, run_id: str, codec: Codec, outputs: Mapping[str, Output]):
        super().__init__()
        self._outputs = {label: (o.prefix(output_dir, run_id), o) for label, o in outputs.items()}
        if len({prefix for prefix, _ in self._outputs.values()}) < len(outputs):
            raise ValueError("two outputs would write the same files")
        self._temp_dir = FileSystems.join(output_dir, f".temp-{uuid.uuid4().hex}")
        self._codec = codec

    # pcolls unannotated, as in Beam's CoGroupByKey: Beam reads expand's annotations as the
    # transform's type hints and logs a root WARNING for any but a PCollection (or PBegin)
    def expand(self, pcolls):
        if set(pcolls) != set(self._outputs):
            raise ValueError(f"outputs {sorted(self._outputs)} and collections {sorted(pcolls)} differ")
        # declared types: Beam would otherwise infer them from the bytecode, ~10 ms a step
        written = [pcolls[label] | label >> beam.ParDo(_WriteBundles(o, prefix, self._temp_dir, self._codec))
                   .with_output_types(tuple[str, str]) for label, (prefix, o) in self._outputs.items()]
        files = written | "Written" >> beam.Flatten()
        outputs = {prefix: o for prefix, o in self._outputs.values()}
        return (files.pipeline | "AfterTheJob" >> beam.Impulse()
                | "NameFiles" >> beam.ParDo(_NameFiles(outputs, self._temp_dir, self._codec),
                                            beam.pvalue.AsList(files)).with_output_types(str))
