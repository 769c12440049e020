"""A dataset directory's own files cannot send the reader outside it, and no split is read past the row limit.

Each hostile layout here would, before these checks, have had ``datasets`` read a file elsewhere on
the machine (a repository's ``data_files``, a ``save_to_disk`` directory's ``state.json``) or
materialise millions of rows declared by a few kilobytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from cahp_engine.data import DatasetOptions, check_card_text, data_file_problem, load_splits
from cahp_engine.errors import ConfigError, DatasetError

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SECRET = "TOP-SECRET-LABEL"
ROWS = [("a fine film", 1), ("a dull film", 0), ("fine acting", 1), ("dull plot", 0)]


def _csv(path: Path, rows: list[tuple[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    return path


def _card(root: Path, config: dict[str, Any], *, name: str = "README.md") -> Path:
    text = yaml.safe_dump({"configs": [{"config_name": "default", **config}]})
    (root / name).write_text(f"---\n{text}---\n# a dataset\n" if name == "README.md" else text)
    return root


def _parquet(path: Path, rows: int) -> Path:
    """``rows`` rows of two texts and two labels, dictionary-encoded: a small file declaring many rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    indices = pa.array([i % 2 for i in range(rows)], type=pa.int8())
    text = pa.DictionaryArray.from_arrays(indices, pa.array(["a fine film", "a dull film"]))
    pq.write_table(pa.table({"text": text, "label": indices}), path, compression="zstd")
    return path


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A directory outside the dataset holding labelled rows whose classes are secrets."""
    return _csv(tmp_path / "secret" / "train.csv", [("x", f"{SECRET}-A"), ("y", f"{SECRET}-B")]).parent


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    _csv(root / "data" / "train-0.csv", ROWS)
    _csv(root / "data" / "test-0.csv", ROWS[:2])
    return root


def _load(root: Path, tmp_path: Path, **kwargs: Any) -> Any:
    return load_splits(root, cache_dir=str(tmp_path / "cache"), **kwargs)


# --- repository layouts ---------------------------------------------------------------------------------


def test_relative_globbed_data_files_still_load(repo: Path, tmp_path: Path) -> None:
    _parquet(repo / "data" / "train-00000-of-00002.parquet", 6)
    _parquet(repo / "data" / "train-00001-of-00002.parquet", 4)
    _parquet(repo / "data" / "test-00000-of-00001.parquet", 4)
    _card(repo, {"data_files": [{"split": "train", "path": "data/train-*.parquet"},
                                {"split": "test", "path": ["./data/test-*.parquet"]}]})
    splits = _load(repo, tmp_path, max_rows=10)
    assert splits.format == "repository" and len(splits.train) == 10 and len(splits.eval) == 4


def _hostile_entries(secret: Path) -> dict[str, dict[str, Any]]:
    train = f"{secret}/train.csv"
    return {
        "absolute": {"data_files": [{"split": "train", "path": train}, {"split": "test", "path": train}]},
        "absolute glob": {"data_files": [{"split": "train", "path": f"{secret.parent}/**/*.csv"}]},
        "string": {"data_files": train},
        "list": {"data_files": ["data/train-0.csv", train]},
        "path list": {"data_files": [{"split": "train", "path": ["data/train-0.csv", train]}]},
        "mapping": {"data_files": {"train": [train], "test": "data/test-0.csv"}},
        "dot-dot": {"data_files": [{"split": "train", "path": "../secret/train.csv"}]},
        "dot-dot glob": {"data_files": [{"split": "train", "path": "data/../../secret/*.csv"}]},
        "https": {"data_files": [{"split": "train", "path": "https://example.com/train.csv"}]},
        "hf": {"data_files": [{"split": "train", "path": "hf://datasets/org/name/train.csv"}]},
        "chained": {"data_files": [{"split": "train", "path": f"zip://train.csv::{secret}/a.zip"}]},
        "scheme without slashes": {"data_files": [{"split": "train", "path": "file:train.csv"}]},
        "home": {"data_files": [{"split": "train", "path": "~/train.csv"}]},
        "backslash": {"data_files": [{"split": "train", "path": "..\\secret\\train.csv"}]},
        "data_dir absolute": {"data_dir": str(secret)},
        "data_dir dot-dot": {"data_dir": "../secret"},
    }


@pytest.mark.parametrize("case", list(_hostile_entries(Path("/x"))))
def test_data_files_that_leave_the_directory_are_refused_before_datasets_reads_anything(
    case: str, repo: Path, secret: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _card(repo, _hostile_entries(secret)[case])

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("datasets was asked to read the directory")

    monkeypatch.setattr(datasets, "load_dataset_builder", never)
    monkeypatch.setattr(datasets, "load_dataset", never)
    monkeypatch.setattr(datasets, "get_dataset_config_names", never)
    with pytest.raises(DatasetError, match="configuration 'default' names the") as caught:
        _load(repo, tmp_path)
    assert "inside the dataset directory" in str(caught.value)
    assert SECRET not in str(caught.value)


def test_a_standalone_yaml_overriding_the_readme_is_checked_too(repo: Path, secret: Path, tmp_path: Path) -> None:
    _card(repo, {"data_files": [{"split": "train", "path": "data/train-*.csv"},
                                {"split": "test", "path": "data/test-*.csv"}]})
    _card(repo, {"data_files": [{"split": "train", "path": f"{secret}/train.csv"}]}, name=".huggingface.yaml")
    with pytest.raises(DatasetError, match=r"\.huggingface\.yaml: configuration 'default'.*absolute path"):
        _load(repo, tmp_path)


def test_a_link_in_the_directory_that_leads_out_is_refused(repo: Path, secret: Path, tmp_path: Path) -> None:
    (repo / "linked").symlink_to(secret, target_is_directory=True)
    _card(repo, {"data_files": [{"split": "train", "path": "linked/*.csv"}, {"split": "test", "path": "data/*.csv"}]})
    with pytest.raises(DatasetError, match="'linked' in .* is a link that leads out of the dataset directory"):
        _load(repo, tmp_path)
    # A link between the directory's own files is fine.
    (repo / "linked").unlink()
    (repo / "linked").symlink_to(repo / "data", target_is_directory=True)
    _card(repo, {"data_files": [{"split": "train", "path": "linked/train-*.csv"},
                                {"split": "test", "path": "data/test-*.csv"}]})
    assert len(_load(repo, tmp_path).train) == len(ROWS)


def test_files_of_other_builders_or_compressed_are_refused(repo: Path, tmp_path: Path) -> None:
    import gzip

    (repo / "data" / "train-0.csv.gz").write_bytes(gzip.compress((repo / "data" / "train-0.csv").read_bytes()))
    _card(repo, {"data_files": [{"split": "train", "path": "data/train-*.csv.gz"},
                                {"split": "test", "path": "data/test-*.csv"}]})
    with pytest.raises(DatasetError, match=r"data file 'data/train-0.csv.gz'.*unpack compressed"):
        _load(repo, tmp_path)


@pytest.mark.parametrize(
    ("front", "message"),
    [("configs: [unclosed", "cannot be parsed at line"), ("- configs: x\n- a list", "must be a mapping"),
     ("configs: {default: x}", "`configs` must be a list"), ("configs:\n- data_files: a.csv", "`config_name`"),
     ("configs:\n- config_name: d\n  data_files: 3", "type int"),
     ("configs:\n- config_name: d\n  data_files: [{split: train}]", "without a `path`"),
     ("dataset_info: 3\nconfigs: []", "`dataset_info` must be a mapping")],
)
def test_malformed_front_matter_gets_a_clear_message(front: str, message: str, repo: Path, tmp_path: Path) -> None:
    (repo / "README.md").write_text(f"---\n{front}\n---\n# x\n")
    with pytest.raises(DatasetError, match=message):
        _load(repo, tmp_path)


def test_a_readme_without_configs_leaves_a_directory_of_split_files_alone(tmp_path: Path) -> None:
    _csv(tmp_path / "d" / "train.csv", ROWS)
    _csv(tmp_path / "d" / "test.csv", ROWS[:2])
    (tmp_path / "d" / "README.md").write_text("---\nnot: [valid\n---\n# a README with a broken header\n")
    assert load_splits(tmp_path / "d").format == "files"


def test_the_rule_for_one_entry() -> None:
    for fine in ("data/train-*.parquet", "./a.csv", "train.csv", "data/**/x.jsonl", "a b/c.csv"):
        assert data_file_problem(fine) is None, fine
    for bad in ("/etc/passwd", "../x", "a/../../x", "s3://b/k", "C:\\x", "C:x", "~root/x", "", " ", 3, None,
                "zip://a::b", "a\\b", "x\x00y"):
        assert data_file_problem(bad) is not None, bad
    assert check_card_text("README.md", "# no front matter\n", where="w") is False


# --- save_to_disk directories ---------------------------------------------------------------------------------


def _saved(root: Path, rows: int = 4) -> Path:
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["a", "b"])})
    part = datasets.Dataset.from_dict({"text": [f"t{i}" for i in range(rows)], "label": [i % 2 for i in range(rows)]},
                                      features)
    datasets.DatasetDict({"train": part, "test": part}).save_to_disk(str(root))
    return root


def _secret_arrow(tmp_path: Path) -> Path:
    """Another saved dataset, outside, whose labels are secrets."""
    part = datasets.Dataset.from_dict({"text": ["x", "y"], "label": [f"{SECRET}-A", f"{SECRET}-B"]})
    part.save_to_disk(str(tmp_path / "elsewhere"))
    return next((tmp_path / "elsewhere").glob("*.arrow"))


def test_state_json_naming_a_file_outside_its_split_is_refused(tmp_path: Path) -> None:
    root = _saved(tmp_path / "saved")
    arrow = _secret_arrow(tmp_path)
    state = root / "train" / "state.json"
    content = json.loads(state.read_text())
    for name in (os.path.relpath(arrow, root / "train"), str(arrow), "sub/x.arrow", ".", "..", ""):
        content["_data_files"] = [{"filename": name}]
        state.write_text(json.dumps(content))
        with pytest.raises(DatasetError, match="state.json names the data file") as caught:
            load_splits(root)
        assert SECRET not in str(caught.value)
    # A plain name that is a link to a file elsewhere is refused too.
    (root / "train" / "linked.arrow").symlink_to(arrow)
    content["_data_files"] = [{"filename": "linked.arrow"}]
    state.write_text(json.dumps(content))
    with pytest.raises(DatasetError, match="'linked.arrow', which is not a file beside it"):
        load_splits(root)


@pytest.mark.parametrize("name", ["state.json", "dataset_info.json", "dataset_dict.json"])
def test_a_link_among_the_json_files_is_refused(name: str, tmp_path: Path) -> None:
    root = _saved(tmp_path / "saved")
    other = _saved(tmp_path / "other")
    target = root / name if name == "dataset_dict.json" else root / "train" / name
    target.unlink()
    target.symlink_to(other / target.relative_to(root))
    with pytest.raises(DatasetError, match=f"{name} in .* is a link"):
        load_splits(root)


@pytest.mark.parametrize("split", ["../other/train", "/tmp", "a/b", "..", ".", 3])
def test_dataset_dict_split_names_are_plain_directory_names(split: Any, tmp_path: Path) -> None:
    root = _saved(tmp_path / "saved")
    _saved(tmp_path / "other")
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", split]}))
    with pytest.raises(DatasetError, match=r"dataset_dict.json names the split"):
        load_splits(root)


# --- the row limit ------------------------------------------------------------------------------------


def test_a_parquet_declaring_too_many_rows_is_refused_from_its_footer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    train = _parquet(tmp_path / "d" / "train.parquet", 1_000_000)
    _parquet(tmp_path / "d" / "test.parquet", 4)
    assert train.stat().st_size < 50_000  # a small file, a million rows

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the rows were read")

    monkeypatch.setattr(pq, "read_table", never)
    with pytest.raises(DatasetError, match=r"split 'train' \(.*train.parquet\) declares 1000000 rows, over the "
                                           r"limit of 100 rows per split; give it at most 100 rows"):
        load_splits(tmp_path / "d", DatasetOptions(eval_split="test"), max_rows=100)


def test_csv_and_jsonl_stop_at_the_limit(tmp_path: Path) -> None:
    _csv(tmp_path / "c" / "train.csv", ROWS * 50)
    _csv(tmp_path / "c" / "test.csv", ROWS)
    with pytest.raises(DatasetError, match=r"split 'train' .* has more than 100 rows, the limit per split"):
        load_splits(tmp_path / "c", max_rows=100)
    assert len(load_splits(tmp_path / "c", max_rows=200).train) == 200
    (tmp_path / "j").mkdir()
    for name, rows in (("train", ROWS * 50), ("test", ROWS)):
        lines = (json.dumps({"text": t, "label": y}) + "\n" for t, y in rows)
        (tmp_path / "j" / f"{name}.jsonl").write_text("".join(lines))
    with pytest.raises(DatasetError, match=r"split 'train' .* has more than 100 rows"):
        load_splits(tmp_path / "j", max_rows=100)


def test_saved_and_repository_splits_are_counted_before_their_rows_are_read(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"split 'test' .* has 300 rows, over the limit of 100"):
        load_splits(_saved(tmp_path / "saved", rows=300), max_rows=100)
    # Parquet: the footers' counts, before datasets converts anything.
    repo = tmp_path / "repo"
    _parquet(repo / "data" / "train-0.parquet", 150)
    _parquet(repo / "data" / "train-1.parquet", 150)
    _parquet(repo / "data" / "test-0.parquet", 4)
    _card(repo, {"data_files": [{"split": "train", "path": "data/train-*.parquet"},
                                {"split": "test", "path": "data/test-*.parquet"}]})
    with pytest.raises(DatasetError, match=r"split 'train' .* declares 300 rows, over the limit of 100"):
        _load(repo, tmp_path, max_rows=100)
    # CSV: the prepared table's count, before its rows become Python objects.
    other = tmp_path / "csv-repo"
    _csv(other / "data" / "train-0.csv", ROWS)
    _csv(other / "data" / "test-0.csv", ROWS * 100)
    _card(other, {"data_files": [{"split": "train", "path": "data/train-*.csv"},
                                 {"split": "test", "path": "data/test-*.csv"}]})
    with pytest.raises(DatasetError, match=r"split 'test' .* has 400 rows, over the limit of 100"):
        _load(other, tmp_path, max_rows=100)


def test_the_limit_is_checked_and_none_lifts_it(tmp_path: Path) -> None:
    _csv(tmp_path / "train.csv", ROWS * 3)
    _csv(tmp_path / "test.csv", ROWS)
    with pytest.raises(ConfigError, match="`max_rows` must be an integer >= 1, got 0"):
        load_splits(tmp_path, max_rows=0)
    assert len(load_splits(tmp_path, max_rows=None).train) == 12


def test_decoded_features_are_not_read(tmp_path: Path) -> None:
    # An Image column opens the path (or URL) each value names when it is read.
    features = datasets.Features({"text": datasets.Image(), "label": datasets.Value("int64")})
    part = datasets.Dataset.from_dict({"text": [{"path": "/etc/hostname", "bytes": None}] * 2, "label": [0, 1]},
                                      features)
    datasets.DatasetDict({"train": part, "test": part}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DatasetError, match="column 'text' of split .* holds Image values"):
        load_splits(tmp_path / "saved")


# --- hub datasets: the card of a hub repository is checked like a local one ---------------------------


def _hub_snapshot(cache: Path, repo: str, card: str) -> None:
    """A hub dataset as the local hub cache holds it (what ``hf_hub_download`` reads offline)."""
    sha = "0" * 40
    folder = cache / f"datasets--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(sha)
    snapshot = folder / "snapshots" / sha
    snapshot.mkdir(parents=True)
    (snapshot / "README.md").write_text(card)


@pytest.mark.parametrize("entry", ["/etc/*.conf", "../../elsewhere/*.csv", "https://example.com/x.csv"])
def test_a_hub_dataset_card_naming_files_outside_its_repository_is_refused_before_reading(
    tmp_path, monkeypatch, entry
):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    text = yaml.safe_dump({"configs": [{"config_name": "default", "data_files": [{"split": "train", "path": entry}]}]})
    _hub_snapshot(tmp_path / "hub", "evil/cards", f"---\n{text}---\n")
    # datasets must never be asked to resolve the card's patterns (the loader swallows its errors, so
    # each call is recorded as well as refused).
    calls: list[str] = []

    def must_not_run(name: str) -> Any:
        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            calls.append(name)
            raise AssertionError(f"datasets.{name} was asked to read the hub dataset")
        return refuse

    for name in ("load_dataset", "load_dataset_builder", "get_dataset_config_names"):
        monkeypatch.setattr(datasets, name, must_not_run(name))
    with pytest.raises(DatasetError, match="hub dataset 'evil/cards'"):
        load_splits("evil/cards")
    assert calls == []


def test_files_a_hub_dataset_resolved_outside_its_repository_are_refused_without_naming_them(tmp_path):
    from datasets.data_files import DataFilesDict

    from cahp_engine.data import check_hub_data_files

    _csv(tmp_path / "private" / "secret-name.csv", ROWS)
    # An absolute pattern in a hub card resolves on this machine's filesystem, whatever the base path.
    resolved = DataFilesDict.from_patterns({"train": [str(tmp_path / "private" / "*.csv")]},
                                           base_path="hf://datasets/evil/cards@main")
    assert any("secret-name" in str(f) for f in resolved["train"])
    with pytest.raises(DatasetError) as refused:
        check_hub_data_files("evil/cards", resolved)
    assert "secret-name" not in str(refused.value)
    # The repository's own files pass.
    check_hub_data_files("evil/cards", {"train": ["hf://datasets/evil/cards@0123abc/data/train.csv"]})
    with pytest.raises(DatasetError):
        check_hub_data_files("evil/cards", {"train": ["hf://datasets/other/repo@main/data/train.csv"]})
    with pytest.raises(DatasetError):
        check_hub_data_files("evil/cards", {"train": ["hf://datasets/evil/cards@main/../../x.csv"]})
