"""Datasets given as a directory of split files: ``{split}.csv``, ``{split}.jsonl`` or ``{split}.parquet``.

Every problem is a :class:`~cahp_engine.errors.DatasetError` naming the file and line.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Container
from pathlib import Path
from typing import Any, Protocol

from cahp_engine.data._options import FILE_SUFFIXES
from cahp_engine.data._table import Source, Table, check_rows, listed, too_many_rows
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


def _decoded(path: Path) -> str:
    data = path.read_bytes()
    if not data.strip():
        raise DatasetError(f"{path} is empty; write the split's labelled rows into it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DatasetError(
            f"{path} is not UTF-8: byte {data[err.start]:#04x} on line {line} cannot be decoded; "
            "re-save the file as UTF-8"
        ) from None
    return text.removeprefix("\ufeff")  # a byte-order mark some editors write


def _read_csv(path: Path, options: Wanted, max_rows: int | None) -> Table:
    # The csv module rather than pandas: pandas fills a row with too few fields with NaN without a
    # word, and its type guessing turns texts such as "NA" or "null" into missing values.
    reader = csv.reader(io.StringIO(_decoded(path), newline=""))
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
            raise DatasetError(f"{path}, line {start}: {err}; fix the quoting of that row") from None
        if not row:
            continue  # blank line
        if header is None:
            header = row
            repeated = sorted({c for c in row if row.count(c) > 1})
            if repeated:
                raise DatasetError(f"{path} repeats the column names {repeated}; give every column its own name")
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
    if header is None or not rows:
        raise DatasetError(f"{path} has a header but no rows; add at least one labelled row per class")
    values = {name: [r[i] for r in rows] for i, name in enumerate(header) if name in options.columns}
    if options.label_column in values:
        values[options.label_column] = csv_labels(values[options.label_column])
    return Table(str(path), tuple(header), values, len(rows), lines)


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
    # split("\n"), not splitlines(): JSON strings may hold U+2028 and other characters splitlines breaks on.
    for number, line in enumerate(_decoded(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(
                f"{path}, line {number} is not valid JSON ({err.msg}, column {err.colno}); "
                "write one JSON object per line"
            ) from None
        if not isinstance(record, dict):
            raise DatasetError(
                f"{path}, line {number} holds a JSON {type(record).__name__}, not an object; "
                'write one object per line, like {"text": "...", "label": 0}'
            )
        if max_rows is not None and len(records) == max_rows:
            raise too_many_rows(path.stem, str(path), max_rows)
        names.update(dict.fromkeys(record))
        records.append(record)
        lines.append(number)
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
        names = tuple(pq.read_schema(path).names)
        table = pq.read_table(path, columns=[c for c in names if c in options.columns])
    except (pa.ArrowException, OSError) as err:
        raise DatasetError(
            f"{path} cannot be read as Parquet ({err}); write it again, e.g. with DataFrame.to_parquet"
        ) from None
    values = {name: table.column(name).to_pylist() for name in table.column_names}
    return Table(str(path), names, values, table.num_rows)


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
