"""Write: every output as Parquet through Beam's file sinks (exactly-once file output, any
FileSystems scheme), into the run's own directory of DIR's history. File names carry the run
id: history/<run_id>/embeddings-<run_id>-00000-of-00002.parquet."""
from __future__ import annotations

import dataclasses

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io import filebasedsink
from apache_beam.io.filesystems import CompressionTypes, FileSystems

ROWS_PER_TABLE = 5000  # batching of small rows into Arrow tables; not a user-facing number


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
    (they never repeat and are never filtered on; these were a large share of writing them)."""
    scalars = [f.name for f in schema if not _is_vector(f.type)]
    compression = {f.name: codec.vectors if _is_vector(f.type) else codec.scalars for f in schema}
    return pq.ParquetWriter(sink, schema, compression=compression, use_dictionary=scalars,
                            write_statistics=scalars)


def output_prefix(output_dir: str, kind: str, run_id: str, part: str | None = None) -> str:
    return FileSystems.join(output_dir, f"{kind}-{run_id}" + (f"-{part}" if part else ""))


class _ParquetSink(filebasedsink.FileBasedSink):
    """Beam's Parquet sink, with the writer of open_writer."""

    def __init__(self, prefix: str, schema: pa.Schema, codec: Codec):
        super().__init__(prefix, coder=None, file_name_suffix=".parquet", mime_type="application/x-parquet",
                         compression_type=CompressionTypes.UNCOMPRESSED)  # the codec compresses pages
        self._schema, self._codec = schema, codec

    def open(self, temp_path):
        handle = super().open(temp_path)
        return open_writer(handle, self._schema, self._codec), handle

    def write_record(self, file, table: pa.Table):
        file[0].write_table(table)

    def close(self, file):
        writer, handle = file
        writer.close()
        handle.close()

    def pre_finalize(self, init_result, writer_results):
        """Delete nothing. Beam clears files matching this sink's final names first, and
        `embeddings-<run>-*-of-00001` matches this run's `embeddings-<run>-reused-...` file as
        well; run ids are unique, so there is never an earlier output of this sink to clear."""


class WriteTables(beam.PTransform):
    """PCollection of pyarrow Tables (already in SCHEMA) -> Parquet files; PART names a second
    set of files of the same kind (`embeddings-<run>-reused-...`): on the local runner a Flatten
    is held in memory whole, so large outputs get a sink each instead."""

    def __init__(self, output_dir: str, kind: str, run_id: str, schema: pa.Schema, codec: Codec,
                 part: str | None = None):
        super().__init__()
        self._sink = _ParquetSink(output_prefix(output_dir, kind, run_id, part), schema, codec)

    def expand(self, tables):
        return tables | beam.io.Write(self._sink)


class WriteRows(beam.PTransform):
    """PCollection of dicts (or NamedTuples) -> Parquet files, batched into Arrow tables."""

    def __init__(self, output_dir: str, kind: str, run_id: str, schema: pa.Schema, codec: Codec,
                 extra: dict | None = None):
        super().__init__()
        self._write = WriteTables(output_dir, kind, run_id, schema, codec)
        self._schema, self._extra = schema, extra or {}

    def expand(self, rows):
        schema, extra = self._schema, self._extra

        def to_table(batch):
            dicts = [{**(r._asdict() if hasattr(r, "_asdict") else r), **extra} for r in batch]
            return pa.Table.from_pylist(dicts, schema=schema)

        return (rows
                | "Batch" >> beam.BatchElements(min_batch_size=1, max_batch_size=ROWS_PER_TABLE)
                | "ToTable" >> beam.Map(to_table)
                | "Write" >> self._write)
