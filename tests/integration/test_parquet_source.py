"""--input as other tools write Parquet: resolved by pipeline/checks/inputs.py, read by
transforms/read/parquet.py's ReadParquetTables in a real Beam pipeline.

The datasets are written with pyarrow's dataset writer (hive flavour), laid out and typed the
way DuckDB (`COPY ... (PARTITION_BY (lang))`: data_0.parquet), Polars (large_string text,
int64 ids) and Spark (part-*.snappy.parquet, with _SUCCESS and .crc files beside them) do.
"""
from __future__ import annotations

import io
import threading
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from pipeline.checks.inputs import InputInfo, inspect_input
from pipeline.checks.scan import scan_input
from pipeline.exits import UsageError
from transforms.dedupe.claimfile import ClaimFile
from transforms.read.parquet import Pull, ReadParquetTables, parquet_file, read_whole

ROWS = [(1, "the quick brown fox", "en"), (2, "съешь ещё этих булок", "ru"), (3, "jumps over", "en"),
        (4, "a lazy dog", None), (5, "и выпей чаю", "ru")]


def corpus(text_type=pa.string(), id_type=pa.int64()) -> pa.Table:
    return pa.table({"id": pa.array([r[0] for r in ROWS]).cast(id_type),
                     "text": pa.array([r[1] for r in ROWS]).cast(text_type),
                     "lang": pa.array([r[2] for r in ROWS])})


def write_hive(table: pa.Table, root: Path, basename: str) -> Path:
    ds.write_dataset(table, root, format="parquet", partitioning=["lang"], partitioning_flavor="hive",
                     basename_template=basename)
    return root


def duckdb_layout(root: Path) -> Path:
    return write_hive(corpus(), root, "data_{i}.parquet")


def polars_layout(root: Path) -> Path:
    return write_hive(corpus(text_type=pa.large_string()), root, "{i}.parquet")


def spark_layout(root: Path) -> Path:
    write_hive(corpus(id_type=pa.int32()), root, "part-0000{i}-5f1e-c000.snappy.parquet")
    (root / "_SUCCESS").write_bytes(b"")
    (root / "._SUCCESS.crc").write_bytes(b"crc")
    for part in root.glob("lang=*/part-*.parquet"):
        (part.parent / f".{part.name}.crc").write_bytes(b"not parquet")
    (root / "_temporary" / "0").mkdir(parents=True)
    (root / "_temporary" / "0" / "part-9.parquet").write_bytes(b"half written")
    return root


def read_rows(info, spread: bool | Pull = True, *options: str) -> None:
    """ReadParquetTables over INFO's files yields ROWS, with partition keys as columns and the
    text column typed string."""
    with beam.Pipeline(runner="FnApiRunner", options=PipelineOptions(list(options))) as p:
        rows = (p | ReadParquetTables(info.files, ["id", "text", "lang"], info.partition_mappings, spread)
                | beam.FlatMap(lambda t: [(*r.values(), str(t.schema.field("text").type)) for r in t.to_pylist()]))
        assert_that(rows, equal_to([(*row, "string") for row in ROWS]))


@pytest.mark.parametrize("layout", [duckdb_layout, polars_layout, spark_layout])
def test_a_hive_dataset_directory_reads_with_its_partition_key_as_a_column(tmp_path, layout):
    root = layout(tmp_path / "dataset")
    info = inspect_input(str(root), "id", "text", ["lang"])
    assert len(info.files) == 3 and all(Path(f).name[0] not in "._" for f in info.files)
    assert info.rows == len(ROWS)
    assert info.kept_fields == (pa.field("lang", pa.string()),)
    read_rows(info)


@pytest.mark.parametrize("spread", [True, False, "pull"])
def test_row_groups_are_shared_among_several_workers_only(tmp_path, spread):
    """Spread: a GroupByKey lets a runner share the row groups (or, pulled, the pullers) among
    workers; two local worker processes pull the row groups from one claim file. Without it (one
    local worker) the read is fused with what follows it, and reads the same rows."""
    info = inspect_input(str(duckdb_layout(tmp_path / "dataset")), "id", "text", ["lang"])
    options = ()
    if spread == "pull":
        spread = Pull(ClaimFile.create(str(tmp_path / "claims.sqlite")), 2)
        options = ("--direct_num_workers", "2", "--direct_running_mode", "multi_processing")
    p = beam.Pipeline(runner="FnApiRunner")
    _ = p | ReadParquetTables(info.files, ["id", "text", "lang"], info.partition_mappings, spread)
    urns = [t.spec.urn for t in p.to_runner_api().components.transforms.values()]
    assert ("beam:transform:group_by_key:v1" in urns) == bool(spread)
    read_rows(info, spread, *options)


def test_a_glob_over_a_hive_dataset_keeps_its_partition_keys(tmp_path):
    root = spark_layout(tmp_path / "dataset")
    info = inspect_input(f"{root}/**/*.parquet", "id", "text", ["lang"])
    assert sorted(dict(p)["lang"] or "" for p in info.partitions) == ["", "en", "ru"]
    read_rows(info)


def test_a_partition_key_can_be_the_id_column(tmp_path):
    table = pa.table({"text": ["one", "two"], "doc": ["a", "b"]})
    ds.write_dataset(table, tmp_path / "d", format="parquet", partitioning=["doc"], partitioning_flavor="hive")
    info = inspect_input(str(tmp_path / "d"), "doc", "text", [])
    with beam.Pipeline(runner="FnApiRunner") as p:
        rows = p | ReadParquetTables(info.files, ["doc", "text"], info.partition_mappings) | beam.FlatMap(
            lambda t: [tuple(r.values()) for r in t.to_pylist()])
        assert_that(rows, equal_to([("a", "one"), ("b", "two")]))


def test_partition_values_are_strings_as_written_in_the_path(tmp_path):
    root = tmp_path / "d"
    (root / "month=01" / "day=2026%2F11").mkdir(parents=True)
    pq.write_table(pa.table({"id": ["x"], "text": ["t"]}), root / "month=01" / "day=2026%2F11" / "f.parquet")
    info = inspect_input(str(root), "id", "text", ["month", "day"])
    assert info.partitions == ((("month", "01"), ("day", "2026/11")),)
    with beam.Pipeline(runner="FnApiRunner") as p:
        rows = (p | ReadParquetTables(info.files, ["id", "month", "day"], info.partition_mappings)
                | beam.FlatMap(lambda t: [tuple(r.values()) for r in t.to_pylist()]))
        assert_that(rows, equal_to([("x", "01", "2026/11")]))


@pytest.mark.parametrize("text_type", [pa.string(), pa.large_string(), pa.string_view(),
                                       pa.dictionary(pa.int32(), pa.string())])
def test_every_string_type_comes_out_as_string(tmp_path, text_type):
    path = tmp_path / "one.parquet"
    pq.write_table(corpus(text_type=text_type, id_type=pa.string()), path, row_group_size=2)
    assert pq.read_schema(path).field("text").type == text_type  # the file keeps its type
    info = inspect_input(str(path), "id", "text", ["lang"])
    assert info.partitions == ()
    with beam.Pipeline(runner="FnApiRunner") as p:
        sizes = (p | ReadParquetTables(info.files, ["id", "text", "lang"])
                 | beam.Map(lambda t: (t.num_rows, [str(f.type) for f in t.schema])))
        assert_that(sizes, equal_to([(2, ["string"] * 3), (2, ["string"] * 3), (1, ["string"] * 3)]))


def test_ids_may_be_integers(tmp_path):
    path = tmp_path / "ints.parquet"
    pq.write_table(corpus(id_type=pa.int64()), path)
    info = inspect_input(str(path), "id", "text", [])
    assert info.rows == len(ROWS)


def only_success_marker(root: Path) -> None:
    (root / "_SUCCESS").write_bytes(b"")


def mixed_partition_keys(root: Path) -> None:
    (root / "lang=en").mkdir()
    pq.write_table(pa.table({"id": ["a"], "text": ["t"]}), root / "lang=en" / "f.parquet")
    pq.write_table(pa.table({"id": ["b"], "text": ["u"]}), root / "g.parquet")


def key_in_file_and_path(root: Path) -> None:
    (root / "lang=en").mkdir()
    pq.write_table(pa.table({"id": ["a"], "text": ["t"], "lang": ["x"]}), root / "lang=en" / "f.parquet")


def not_parquet(root: Path) -> None:
    (root / "notes.txt").write_text("hello")


@pytest.mark.parametrize("make, words", [
    (only_success_marker, ["no file matches"]),
    (mixed_partition_keys, ["different partition keys", "(none) vs lang"]),
    (key_in_file_and_path, ["'lang' is both in the file and a partition key"]),
    (not_parquet, ["notes.txt: not a readable Parquet file"]),
])
def test_a_dataset_that_cannot_be_read_is_one_clear_error(tmp_path, make, words):
    root = tmp_path / "d"
    root.mkdir()
    make(root)
    with pytest.raises(UsageError) as err:
        inspect_input(str(root), "id", "text", ["lang"])
    for word in words:
        assert word in str(err.value)


class _WatchedFile(io.BytesIO):
    """Notes whether each call Arrow makes into it comes from the calling thread."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.elsewhere, self._caller = 0, threading.get_ident()

    def _note(self) -> None:
        self.elsewhere += threading.get_ident() != self._caller

    def read(self, *args):
        self._note()
        return super().read(*args)

    def seek(self, *args):
        self._note()
        return super().seek(*args)

    def tell(self):
        self._note()
        return super().tell()


def test_arrow_reads_a_python_file_object_only_in_the_callers_thread(monkeypatch):
    """An Arrow thread that touched a Python file may drop the last reference to it after the
    read returned, and at interpreter exit that aborts the process (exit 134). ParquetFile's
    default pre-buffering reads on Arrow's IO threads (2 calls of 8 here), a read of several row
    groups with threads on its CPU threads (18 of 26)."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": [str(i) for i in range(50_000)], "text": ["x" * 20] * 50_000}), buffer,
                   row_group_size=5_000)
    data = buffer.getvalue()
    opened = []

    def open_watched(path):
        opened.append(_WatchedFile(data))
        return opened[-1]

    monkeypatch.setattr("pipeline.checks.scan.open_parquet", open_watched)
    reads = {"whole": lambda f: read_whole(f, ["id"]),
             "row group": lambda f: parquet_file(f).read_row_group(3, columns=["id", "text"]),
             "batches": lambda f: list(parquet_file(f).iter_batches(512, row_groups=[1], columns=["text"])),
             "the input's scan": lambda f: scan_input(InputInfo(("corpus.parquet",), 50_000, ()), "id", "text")}
    for name, read in reads.items():
        opened.clear()
        read(open_watched("corpus.parquet"))
        assert all(f.elsewhere == 0 for f in opened), name
