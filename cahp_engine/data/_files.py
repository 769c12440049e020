"""Datasets given as a directory of split files: ``{split}.csv``, ``{split}.jsonl`` or ``{split}.parquet``.

Every problem is a :class:`~cahp_engine.errors.DatasetError` naming the file and line.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from collections import Counter
from collections.abc import Container, Iterator
from pathlib import Path
from typing import Any, Protocol

from cahp_engine.data._options import FILE_SUFFIXES
from cahp_engine.data._table import (
    MAX_COLUMNS,
    MAX_SPLIT_BYTES,
    Source,
    Table,
    check_rows,
    listed,
    too_large,
    too_many_rows,
)
from cahp_engine.errors import DatasetError

_INTEGER = re.compile(r"^[+-]?\d+$")


class Wanted(Protocol):
    """Which columns a reader keeps (:class:`DatasetOptions`, or :data:`EVERY_COLUMN`) and which one holds labels."""

    @property
    def columns(self) -> Container[str]: ...

    @property
    def label_column(self) -> str | None: ...


class _Everything:
    """Every column, none of them read as labels (CSV values stay the text of the file)."""

    class _All:
        def __contains__(self, _name: object) -> bool:
            return True

    columns: Container[str] = _All()
    label_column: str | None = None


#: Read every column as it is in the file (for profiling a dataset before its options are known).
EVERY_COLUMN: Wanted = _Everything()


def read_split(path: Path, wanted: Wanted = EVERY_COLUMN, max_rows: int | None = None) -> Table:
    """One split file (``.csv``, ``.jsonl`` or ``.parquet``) as a :class:`Table` of the ``wanted`` columns."""
    readers = {".csv": _read_csv, ".jsonl": _read_jsonl, ".parquet": _read_parquet}
    return readers[path.suffix.lower()](path, wanted, max_rows)


def files_source(root: Path, max_rows: int | None = None) -> Source:
    """The split files of ``root``; reading one refuses it past ``max_rows`` rows (None: no limit)."""
    by_split: dict[str, Path] = {}
    for entry in sorted(root.iterdir()):
        if not entry.is_file() or entry.name.startswith(".") or entry.suffix.lower() not in FILE_SUFFIXES:
            continue
        if entry.stem in by_split:
            raise DatasetError(
                f"split {entry.stem!r} has two files in {root}: {by_split[entry.stem].name} and "
                f"{entry.name}; keep one of them"
            )
        by_split[entry.stem] = entry
    if not by_split:
        present = sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir())
        raise DatasetError(
            f"{root} holds no split files; expected files like train.csv and test.csv (suffixes "
            f"{', '.join(FILE_SUFFIXES)}; JSON Lines must end in .jsonl). It holds {listed(present)}"
        )
    return Source(splits=tuple(by_split), read=lambda split, options: read_split(by_split[split], options, max_rows))


def _text_file(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 text file, read as a stream (``\\n`` ends a line), within :data:`MAX_SPLIT_BYTES`."""
    size = path.stat().st_size
    if size > MAX_SPLIT_BYTES:
        raise too_large(str(path), f"is {size:,} bytes")
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):  # binary lines end at b"\n" only
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DatasetError(
                    f"{path} is not UTF-8: byte {raw[err.start]:#04x} on line {number} cannot be decoded; "
                    "re-save the file as UTF-8"
                ) from None
            yield line.removeprefix("\ufeff") if number == 1 else line  # a byte-order mark some editors write


def _read_csv(path: Path, options: Wanted, max_rows: int | None) -> Table:
    # The csv module rather than pandas: pandas fills a row with too few fields with NaN without a
    # word, and its type guessing turns texts such as "NA" or "null" into missing values.
    reader = csv.reader(_text_file(path))
    header: list[str] | None = None
    rows: list[list[str]] = []
    lines: list[int] = []
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            raise DatasetError(f"{path}, line {start}: {str(err)[:200]}; fix the quoting of that row") from None
        if not row or (header is None and not any(field.strip() for field in row)):
            continue  # blank line
        if header is None:
            header = _csv_header(path, row)
            continue
        if len(row) != len(header):
            raise DatasetError(
                f"{path}, line {start}: {len(row)} fields where the header has {len(header)}; quote fields "
                'that contain commas (like "a, b"), and give every row one value per column'
            )
        if max_rows is not None and len(rows) == max_rows:
            raise too_many_rows(path.stem, str(path), max_rows)
        rows.append(row)
        lines.append(start)
    if header is None:
        raise DatasetError(f"{path} is empty; write the split's labelled rows into it")
    if not rows:
        raise DatasetError(f"{path} has a header but no rows; add at least one labelled row per class")
    values = {name: [r[i] for r in rows] for i, name in enumerate(header) if name in options.columns}
    if options.label_column in values:
        values[options.label_column] = csv_labels(values[options.label_column])
    return Table(str(path), tuple(header), values, len(rows), lines)


def _csv_header(path: Path, row: list[str]) -> list[str]:
    """The header row, refused with too many columns or a name given twice (one pass over the names)."""
    if len(row) > MAX_COLUMNS:
        raise DatasetError(
            f"{path} has {len(row):,} columns, more than cahp's limit of {MAX_COLUMNS:,} (MAX_COLUMNS); keep "
            "the text, pair and label columns"
        )
    repeated = sorted(name for name, count in Counter(row).items() if count > 1)
    if repeated:
        raise DatasetError(f"{path} repeats the column names [{listed(repeated)}]; give every column its own name")
    return row


def csv_labels(raw: list[str]) -> list[Any]:
    """CSV labels are text: whole numbers become ints, empty fields missing, anything else stays a string."""
    stripped = [v.strip() for v in raw]
    present = [v for v in stripped if v]
    as_int = bool(present) and all(_INTEGER.match(v) for v in present)
    return [None if not v else int(v) if as_int else v for v in stripped]


def _read_jsonl(path: Path, options: Wanted, max_rows: int | None) -> Table:
    names: dict[str, None] = {}  # insertion-ordered set
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    # Lines end at "\n" only: JSON strings may hold U+2028 and other characters splitlines breaks on.
    blank = True
    for number, line in enumerate(_text_file(path), start=1):
        if not line.strip():
            continue
        blank = False
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(
                f"{path}, line {number} is not valid JSON ({err.msg}, column {err.colno}); "
                "write one JSON object per line"
            ) from None
        except RecursionError:
            raise DatasetError(
                f"{path}, line {number} nests its JSON deeper than Python's recursion limit "
                f"({sys.getrecursionlimit()}); write one flat object per line"
            ) from None
        if not isinstance(record, dict):
            raise DatasetError(
                f"{path}, line {number} holds a JSON {type(record).__name__}, not an object; "
                'write one object per line, like {"text": "...", "label": 0}'
            )
        if max_rows is not None and len(records) == max_rows:
            raise too_many_rows(path.stem, str(path), max_rows)
        names.update(dict.fromkeys(record))
        if len(names) > MAX_COLUMNS:
            raise DatasetError(f"{path}, line {number}: more than cahp's limit of {MAX_COLUMNS:,} distinct keys "
                               "(MAX_COLUMNS); keep the text, pair and label fields")
        records.append(record)
        lines.append(number)
    if blank:
        raise DatasetError(f"{path} is empty; write the split's labelled rows into it")
    values = {name: [r.get(name) for r in records] for name in names if name in options.columns}
    return Table(str(path), tuple(names), values, len(records), lines)


def _read_parquet(path: Path, options: Wanted, max_rows: int | None) -> Table:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.stat().st_size == 0:
        raise DatasetError(f"{path} is empty; write the split into it again")
    # The footer says how many rows the file holds; a few kilobytes can declare millions of
    # compressed rows, so the count is checked before any of them is decoded.
    check_rows(path.stem, str(path), parquet_rows(path), max_rows, declared=True)
    try:
        with pq.ParquetFile(path) as parquet:
            schema = parquet.schema_arrow
            names = tuple(schema.names)
            wanted = [c for c in names if c in options.columns]
            _check_stored_size(path, parquet.metadata, wanted)
        # Text columns stay dictionary-encoded while read, so that their decoded size is known before
        # a single value becomes a Python string.
        texts = [c for c in wanted if _is_text(schema.field(c).type)]
        table = pq.read_table(path, columns=wanted, read_dictionary=texts, use_threads=False)
    except (pa.ArrowException, OSError) as err:
        raise DatasetError(
            f"{path} cannot be read as Parquet ({str(err)[:200]}); write it again, e.g. with DataFrame.to_parquet"
        ) from None
    decoded = sum(_decoded_bytes(table.column(name)) for name in table.column_names)
    if decoded > MAX_SPLIT_BYTES:
        raise too_large(str(path), f"decodes to {decoded:,} bytes")
    values = {name: table.column(name).to_pylist() for name in table.column_names}
    return Table(str(path), names, values, table.num_rows)


def _check_stored_size(path: Path, metadata: Any, columns: list[str]) -> None:
    """Refuse a file whose wanted columns' pages (dictionary pages included) uncompress past the limit."""
    stored = 0
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for i in range(row_group.num_columns):
            chunk = row_group.column(i)
            if chunk.path_in_schema.split(".")[0] in columns:
                stored += max(int(chunk.total_uncompressed_size), 0)
    if stored > MAX_SPLIT_BYTES:
        raise too_large(str(path), f"declares {stored:,} uncompressed bytes")


def _is_text(kind: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
                or pa.types.is_large_binary(kind))


def _decoded_bytes(column: Any) -> int:
    """What a column's values take once decoded: a dictionary column's entries counted once per row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    total = 0
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type):
            if len(chunk.dictionary) and _is_text(chunk.dictionary.type):
                lengths = pc.binary_length(chunk.dictionary)
                total += int(pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0)
            total += chunk.indices.nbytes
        else:
            total += chunk.nbytes
    return total


def parquet_rows(path: Path) -> int:
    """The rows a Parquet file declares, read from its footer alone (the larger of the file's count and
    the sum of its row groups', which readers go by)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(path) as parquet:
            metadata = parquet.metadata
        groups = sum(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
    except (pa.ArrowException, OSError) as err:
        raise DatasetError(
            f"{path} cannot be read as Parquet ({err}); write it again, e.g. with DataFrame.to_parquet"
        ) from None
    return max(int(metadata.num_rows), int(groups))
