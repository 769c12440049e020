"""Reading labelled datasets from split files, save_to_disk directories and hub ids."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cahp_engine.data import DatasetOptions, DatasetSplits, load_splits
from cahp_engine.errors import DatasetError, InvalidInputError
from tests.support.datasets import write_csv, write_glue_like_dataset

# tests/engine/data/<this file> -> parents[3] is the repository, parents[4] the folder that holds shared/.
SST5 = Path(__file__).resolve().parents[4] / "shared/data/sst5"

TRAIN = [("a fine film", 1), ("a dull film", 0), ("fine acting", 1), ("dull plot", 0), ("so fine", 1)]
TEST = [("fine ending", 1), ("dull ending", 0)]


def rows_csv(rows: list[tuple[str, int]]) -> str:
    return "text,label\n" + "".join(f'"{t}",{y}\n' for t, y in rows)


def write_jsonl(path: Path, records: list[object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture
def csv_dir(tmp_path: Path) -> Path:
    write_csv(tmp_path / "train.csv", rows_csv(TRAIN))
    write_csv(tmp_path / "test.csv", rows_csv(TEST))
    return tmp_path


# --- formats ------------------------------------------------------------------------------------------


def test_csv_round_trip(csv_dir: Path) -> None:
    splits = load_splits(str(csv_dir))
    assert isinstance(splits, DatasetSplits)
    assert splits.format == "files"
    assert splits.source == str(csv_dir.resolve())
    assert splits.splits_found == ("test", "train")
    assert splits.eval_split == "test"
    assert splits.train.texts == tuple(t for t, _ in TRAIN)
    assert splits.train.labels.tolist() == [y for _, y in TRAIN]
    assert splits.eval.texts == tuple(t for t, _ in TEST)
    assert splits.eval.labels.tolist() == [1, 0]
    assert splits.label_names == splits.train.label_names == splits.eval.label_names == ("0", "1")
    assert splits.train.text_pairs is None


def test_csv_keeps_quoted_commas_newlines_and_na_like_texts(tmp_path: Path) -> None:
    # pandas would read "NA" and "null" as missing; they are texts here.
    write_csv(
        tmp_path / "train.csv",
        'text,label\n"one, two",0\n"first line\nsecond line",1\nNA,0\nnull,1\n',
    )
    write_csv(tmp_path / "test.csv", "text,label\nNone,0\nok,1\n")
    splits = load_splits(tmp_path)
    assert splits.train.texts == ("one, two", "first line\nsecond line", "NA", "null")
    assert splits.eval.texts == ("None", "ok")


def test_jsonl_round_trip_with_string_labels_mapped_once(tmp_path: Path) -> None:
    write_jsonl(
        tmp_path / "train.jsonl",
        [{"text": "great", "label": "pos"}, {"text": "meh", "label": "neu"}, {"text": "bad", "label": "neg"}],
    )
    # eval lacks "neu": it must still map with train's mapping, not one of its own.
    write_jsonl(tmp_path / "test.jsonl", [{"text": "awful", "label": "neg"}, {"text": "superb", "label": "pos"}])
    splits = load_splits(tmp_path)
    assert splits.label_names == ("neg", "neu", "pos")
    assert splits.train.labels.tolist() == [2, 1, 0]
    assert splits.eval.labels.tolist() == [0, 2]
    assert splits.eval.label_names == ("neg", "neu", "pos")


def test_integer_labels_with_a_class_absent_from_eval(tmp_path: Path) -> None:
    write_csv(tmp_path / "train.csv", "text,label\na,0\nb,1\nc,2\n")
    write_csv(tmp_path / "test.csv", "text,label\nd,2\ne,0\n")
    splits = load_splits(tmp_path)
    assert splits.label_names == ("0", "1", "2")
    assert splits.eval.labels.tolist() == [2, 0]


def test_parquet_round_trip_with_sentence_pairs(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {
            "premise": ["a cat sat", "a dog ran", "it rained"],
            "hypothesis": ["a cat", "a cat", "sun"],
            "y": [1, 0, 0],
        }
    )
    frame.to_parquet(tmp_path / "train.parquet")
    frame.iloc[:2].to_parquet(tmp_path / "validation.parquet")
    options = DatasetOptions(text_column="premise", text_pair_column="hypothesis", label_column="y")
    splits = load_splits(tmp_path, options)
    assert splits.eval_split == "validation"
    assert splits.train.texts == ("a cat sat", "a dog ran", "it rained")
    assert splits.train.text_pairs == ("a cat", "a cat", "sun")
    assert splits.eval.text_pairs == ("a cat", "a cat")
    assert splits.train.labels.dtype == np.int64
    assert splits.train.labels.tolist() == [1, 0, 0]


def test_csv_sentence_pairs(tmp_path: Path) -> None:
    write_csv(tmp_path / "train.csv", "s1,s2,label\nx,y,0\nx,x,1\n")
    write_csv(tmp_path / "dev.csv", "s1,s2,label\ny,y,1\n")
    splits = load_splits(tmp_path, DatasetOptions(text_column="s1", text_pair_column="s2"))
    assert splits.train.text_pairs == ("y", "x")
    assert splits.eval.text_pairs == ("y",)
    assert splits.eval_split == "dev"


def test_save_to_disk_round_trip_uses_class_label_names(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=["negative", "positive"])}
    )
    saved = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"sentence": ["bad", "good", "fine"], "label": [0, 1, 1]}, features),
            "validation": datasets.Dataset.from_dict({"sentence": ["great"], "label": [1]}, features),
        }
    )
    saved.save_to_disk(str(tmp_path / "saved"))
    splits = load_splits(tmp_path / "saved", DatasetOptions(text_column="sentence"))
    assert splits.format == "save_to_disk"
    assert splits.splits_found == ("train", "validation")
    assert splits.label_names == ("negative", "positive")
    assert splits.train.texts == ("bad", "good", "fine")
    assert splits.train.labels.tolist() == [0, 1, 1]
    assert splits.eval.texts == ("great",)


def test_save_to_disk_class_with_no_training_samples(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["a", "b", "c"])}
    )
    part = datasets.Dataset.from_dict({"text": ["x", "y"], "label": [0, 1]}, features)
    datasets.DatasetDict({"train": part, "test": part}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DatasetError, match=r"classes \['c'\] have no samples in split 'train'"):
        load_splits(tmp_path / "saved")


def test_single_saved_dataset_is_refused(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["x", "y"], "label": [0, 1]}).save_to_disk(str(tmp_path / "one"))
    with pytest.raises(DatasetError, match="single Dataset, not a DatasetDict"):
        load_splits(tmp_path / "one")


# --- choosing splits ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("present", "expected"),
    [(("test", "validation", "dev"), "test"), (("validation", "dev"), "validation"), (("dev",), "dev")],
)
def test_default_eval_split_is_the_first_of_test_validation_dev(
    tmp_path: Path, present: tuple[str, ...], expected: str
) -> None:
    write_csv(tmp_path / "train.csv", rows_csv(TRAIN))
    for i, split in enumerate(present):
        write_csv(tmp_path / f"{split}.csv", rows_csv(TEST[: i + 1]))
    splits = load_splits(tmp_path)
    assert splits.eval_split == expected
    assert len(splits.eval) == present.index(expected) + 1


def test_explicit_splits(csv_dir: Path) -> None:
    write_csv(csv_dir / "held_out.csv", rows_csv(TEST[:1]))
    write_csv(csv_dir / "full.csv", rows_csv(TRAIN + TEST))
    splits = load_splits(csv_dir, DatasetOptions(train_split="full", eval_split="held_out"))
    assert len(splits.train) == 7
    assert splits.eval.texts == ("fine ending",)


def test_no_eval_split_found(tmp_path: Path) -> None:
    write_csv(tmp_path / "train.csv", rows_csv(TRAIN))
    write_csv(tmp_path / "holdout.csv", rows_csv(TEST))
    with pytest.raises(DatasetError, match=r"none of the splits test, validation, .*dev.* with labels.*'holdout', "
                                           r"'train'.*eval_split"):
        load_splits(tmp_path)


@pytest.mark.parametrize("option", ["train_split", "eval_split"])
def test_missing_split_lists_the_splits(csv_dir: Path, option: str) -> None:
    with pytest.raises(DatasetError, match=rf"no split 'training'; its splits are 'test', 'train'. Set `{option}`"):
        load_splits(csv_dir, DatasetOptions(**{option: "training"}))


# --- options ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"text_column": ""}, "`text_column` must be a non-empty string, got ''"),
        ({"label_column": 3}, "`label_column` must be a non-empty string, got 3"),
        ({"eval_split": " "}, "`eval_split` must be a non-empty string"),
        ({"text_column": "x", "label_column": "x"}, "must differ"),
        ({"text_pair_column": "text"}, "`text_pair_column` must differ"),
        ({"train_split": "a", "eval_split": "a"}, "`eval_split` must differ from `train_split`"),
    ],
)
def test_options_are_validated(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(DatasetError, match=message) as caught:
        DatasetOptions(**kwargs)  # type: ignore[arg-type]
    assert isinstance(caught.value, InvalidInputError)


# --- bad sources --------------------------------------------------------------------------------------


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist; pass a directory"):
        load_splits(tmp_path / "nowhere" / "data")


@pytest.mark.parametrize("ref", ["", "  ", None])
def test_empty_ref(ref: object) -> None:
    with pytest.raises(DatasetError, match="`ref` must name a dataset directory or a hub dataset id"):
        load_splits(ref)  # type: ignore[arg-type]


def test_a_file_instead_of_a_directory(csv_dir: Path) -> None:
    with pytest.raises(DatasetError, match="is a file; pass the directory that holds it"):
        load_splits(csv_dir / "train.csv")


def test_directory_without_split_files_lists_its_contents(tmp_path: Path) -> None:
    (tmp_path / "train.tsv").write_text("text\tlabel\n")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "raw").mkdir()
    with pytest.raises(DatasetError, match=r"holds no split files.*It holds 'notes.txt', 'raw/', 'train.tsv'"):
        load_splits(tmp_path)


def test_two_files_for_one_split(csv_dir: Path) -> None:
    write_jsonl(csv_dir / "train.jsonl", [{"text": "x", "label": 0}])
    with pytest.raises(DatasetError, match="split 'train' has two files.*train.csv and train.jsonl"):
        load_splits(csv_dir)


def test_missing_column_lists_the_columns(csv_dir: Path) -> None:
    with pytest.raises(DatasetError, match=r"no column 'sentence'; its columns are 'text', 'label'. Set `text_column`"):
        load_splits(csv_dir, DatasetOptions(text_column="sentence"))
    with pytest.raises(DatasetError, match=r"no column 'premise'.*Set `text_pair_column`"):
        load_splits(csv_dir, DatasetOptions(text_pair_column="premise"))


@pytest.mark.parametrize("name", ["train.csv", "test.jsonl"])
def test_empty_file(tmp_path: Path, name: str) -> None:
    write_csv(tmp_path / "train.csv", rows_csv(TRAIN))
    write_jsonl(tmp_path / "test.jsonl", [{"text": t, "label": y} for t, y in TEST])
    (tmp_path / name).write_bytes(b"" if name.endswith(".csv") else b"\n  \n")
    with pytest.raises(DatasetError, match=rf"{name} is empty"):
        load_splits(tmp_path)


def test_header_without_rows(csv_dir: Path) -> None:
    write_csv(csv_dir / "test.csv", "text,label\n")
    with pytest.raises(DatasetError, match="test.csv has a header but no rows"):
        load_splits(csv_dir)


def test_parquet_without_rows(tmp_path: Path) -> None:
    pd.DataFrame({"text": ["a", "b"], "label": [0, 1]}).to_parquet(tmp_path / "train.parquet")
    pd.DataFrame({"text": pd.Series([], dtype=str), "label": pd.Series([], dtype="int64")}).to_parquet(
        tmp_path / "test.parquet"
    )
    with pytest.raises(DatasetError, match="test.parquet has no rows"):
        load_splits(tmp_path)


def test_unreadable_parquet(csv_dir: Path) -> None:
    (csv_dir / "test.csv").unlink()
    (csv_dir / "test.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match="cannot be read as Parquet"):
        load_splits(csv_dir)


@pytest.mark.parametrize("name", ["train.csv", "train.jsonl"])
def test_non_utf8_bytes_name_the_file_and_line(tmp_path: Path, name: str) -> None:
    good = (
        rows_csv(TRAIN)
        if name.endswith(".csv")
        else "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in TRAIN)
    )
    lines = good.encode().split(b"\n")
    lines[3] = lines[3][:2] + b"\xe9" + lines[3][2:]  # a Latin-1 e-acute
    (tmp_path / name).write_bytes(b"\n".join(lines))
    write_csv(tmp_path / "test.csv", rows_csv(TEST))
    with pytest.raises(DatasetError, match=rf"{name} is not UTF-8: byte 0xe9 on line 4.*re-save the file as UTF-8"):
        load_splits(tmp_path)


def test_utf8_byte_order_mark_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_bytes(b"\xef\xbb\xbf" + rows_csv(TRAIN).encode())
    write_csv(tmp_path / "test.csv", rows_csv(TEST))
    assert load_splits(tmp_path).train.texts[0] == "a fine film"


@pytest.mark.parametrize(
    ("row", "fields"),
    [("a fine film,1,extra", 3), ("a film with no label", 1), ('"quoted, but",1,', 3)],
    ids=["too-many", "too-few", "trailing-comma"],
)
def test_ragged_csv_rows_name_the_line(tmp_path: Path, row: str, fields: int) -> None:
    # A quoted field spanning two lines first, so the line number must count physical lines.
    write_csv(tmp_path / "train.csv", f'text,label\n"two\nlines",0\nok,1\n{row}\nfine,0\n')
    write_csv(tmp_path / "test.csv", rows_csv(TEST))
    with pytest.raises(DatasetError, match=rf"train.csv, line 5: {fields} fields where the header has 2"):
        load_splits(tmp_path)


def test_repeated_csv_header(csv_dir: Path) -> None:
    write_csv(csv_dir / "test.csv", "text,label,text\na,0,b\n")
    with pytest.raises(DatasetError, match=r"repeats the column names \['text'\]"):
        load_splits(csv_dir)


@pytest.mark.parametrize(
    ("line", "message"),
    [("[1, 2]", "line 2 holds a JSON list, not an object"), ('{"text": "x",', "line 2 is not valid JSON")],
)
def test_jsonl_line_that_is_not_an_object(tmp_path: Path, line: str, message: str) -> None:
    (tmp_path / "train.jsonl").write_text(f'{{"text": "a", "label": 0}}\n{line}\n{{"text": "b", "label": 1}}\n')
    write_csv(tmp_path / "test.csv", rows_csv(TEST))
    with pytest.raises(DatasetError, match=message):
        load_splits(tmp_path)


# --- bad texts and labels -----------------------------------------------------------------------------


def test_missing_texts_give_the_count_and_column(tmp_path: Path) -> None:
    write_csv(tmp_path / "train.csv", "text,label\na,0\n,1\nb,1\n,0\n")
    write_csv(tmp_path / "test.csv", rows_csv(TEST))
    with pytest.raises(
        DatasetError,
        match=r"2 of 4 rows in .*train.csv have no text in column 'text' \(the first at line 3\)",
    ):
        load_splits(tmp_path)


def test_null_and_absent_jsonl_texts_are_missing(tmp_path: Path) -> None:
    write_jsonl(
        tmp_path / "train.jsonl",
        [{"text": "a", "label": 0}, {"text": None, "label": 1}, {"label": 1}, {"text": "b", "label": 0}],
    )
    write_csv(tmp_path / "test.csv", rows_csv(TEST))
    with pytest.raises(DatasetError, match=r"2 of 4 rows .* no text in column 'text' \(the first at line 2\)"):
        load_splits(tmp_path)


def test_non_string_text(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"text": "a", "label": 0}, {"text": 42, "label": 1}])
    write_csv(tmp_path / "test.csv", rows_csv(TEST))
    with pytest.raises(DatasetError, match="column 'text' of .* must hold text, but line 2 holds int 42"):
        load_splits(tmp_path)


def test_one_class_only(tmp_path: Path) -> None:
    write_csv(tmp_path / "train.csv", "text,label\na,pos\nb,pos\n")
    write_csv(tmp_path / "test.csv", "text,label\nc,pos\n")
    with pytest.raises(DatasetError, match=r"has one class only \('pos' in column 'label'\)"):
        load_splits(tmp_path)


def test_integer_class_with_no_training_samples(tmp_path: Path) -> None:
    write_csv(tmp_path / "train.csv", "text,label\na,0\nb,1\nc,3\n")
    write_csv(tmp_path / "test.csv", "text,label\nd,0\n")
    with pytest.raises(DatasetError, match=r"train.csv, column 'label': .*every class present; found \[0, 1, 3\]"):
        load_splits(tmp_path)


def test_eval_label_not_seen_in_train(tmp_path: Path) -> None:
    write_csv(tmp_path / "train.csv", "text,label\na,neg\nb,pos\n")
    write_csv(tmp_path / "test.csv", "text,label\nc,neu\nd,pos\ne,other\n")
    with pytest.raises(DatasetError, match=r"test.csv has labels \['neu', 'other'\] that .*train.csv does not have"):
        load_splits(tmp_path)


def test_unlabelled_eval_split_gets_a_hint(tmp_path: Path) -> None:
    write_csv(tmp_path / "train.csv", "text,label\na,0\nb,1\n")
    write_csv(tmp_path / "test.csv", "text,label\nc,-1\nd,-1\n")
    # Passed over by the default rule, and named in the message.
    with pytest.raises(DatasetError, match=r"test has no labels: every one is -1.*Set `eval_split`"):
        load_splits(tmp_path)
    # Named explicitly, it is refused with the hint.
    with pytest.raises(DatasetError, match="looks unlabelled.*`eval_split`"):
        load_splits(tmp_path, DatasetOptions(eval_split="test"))


def test_missing_labels(tmp_path: Path) -> None:
    write_csv(tmp_path / "train.csv", "text,label\na,0\nb,\nc,1\n")
    write_csv(tmp_path / "test.csv", rows_csv(TEST))
    with pytest.raises(DatasetError, match="train.csv, column 'label': some rows have no label"):
        load_splits(tmp_path)
    write_csv(tmp_path / "train.csv", "text,label\na,0\nc,1\n")
    write_csv(tmp_path / "test.csv", "text,label\nx,1\ny,\n")
    with pytest.raises(DatasetError, match=r"1 of 2 rows in .*test.csv have no label .*the first at line 3"):
        load_splits(tmp_path)


# --- real data and the hub ----------------------------------------------------------------------------


@pytest.mark.skipif(not SST5.is_dir(), reason=f"{SST5} is not here")
def test_reads_sst5() -> None:
    splits = load_splits(SST5)
    assert splits.splits_found == ("test", "train", "validation")
    assert splits.eval_split == "test"
    assert (len(splits.train), len(splits.eval)) == (8544, 2210)
    assert splits.label_names == ("0", "1", "2", "3", "4")
    assert np.bincount(splits.train.labels).tolist() == [1092, 2218, 1624, 2322, 1288]
    assert np.bincount(splits.eval.labels).tolist() == [279, 633, 389, 510, 399]
    validation = load_splits(SST5, DatasetOptions(eval_split="validation")).eval
    assert np.bincount(validation.labels).tolist() == [139, 289, 229, 279, 165]


def test_unknown_hub_id_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # so no local folder of that name can answer instead
    with pytest.raises(DatasetError, match="not found on the Hugging Face hub or in the local cache.*Pass a local"):
        load_splits("cahp-tests/no-such-dataset", cache_dir=str(tmp_path / "cache"))


def test_missing_datasets_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError, match=r"install it with `pip install cahp\[hub\]`"):
        load_splits("some-org/some-dataset")
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "dataset_dict.json").write_text('{"splits": ["train"]}')
    with pytest.raises(DatasetError, match=r"save_to_disk directory needs the optional `datasets`"):
        load_splits(tmp_path / "saved")


# --- datasets named as users name them: configurations, MNLI's splits, GLUE's unlabelled tests ----------------


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    return write_glue_like_dataset(tmp_path / "glue-like")


def test_a_configuration_is_read_with_mnli_splits_and_pairs(repository: Path, tmp_path: Path) -> None:
    options = DatasetOptions(config="mnli", text_column="premise", text_pair_column="hypothesis")
    splits = load_splits(repository, options, cache_dir=str(tmp_path / "cache"))
    assert splits.format == "repository" and splits.eval_split == "validation_matched"
    assert splits.splits_found == ("train", "validation_matched", "validation_mismatched", "test_matched")
    assert splits.train.text_pairs is not None and splits.train.text_pairs[:2] == ("it is good", "it is bad")
    other = DatasetOptions(config="mnli", text_column="premise", text_pair_column="hypothesis",
                           eval_split="validation_mismatched")
    mismatched = load_splits(repository, other, cache_dir=str(tmp_path / "cache"))
    assert mismatched.eval.texts == ("a film", "a dull film", "a fine film")


def test_an_unlabelled_test_split_is_passed_over_by_the_default_rule(repository: Path, tmp_path: Path) -> None:
    splits = load_splits(repository, DatasetOptions(config="sst2", text_column="sentence"),
                         cache_dir=str(tmp_path / "cache"))
    assert splits.eval_split == "validation" and splits.eval.texts == ("fine", "poor")
    # Named explicitly, an unlabelled split is what the user asked for: its -1 labels are then refused.
    with pytest.raises(DatasetError):
        load_splits(repository, DatasetOptions(config="sst2", text_column="sentence", eval_split="test"),
                    cache_dir=str(tmp_path / "cache"))


def test_configurations_are_named_and_checked(repository: Path, csv_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"several configurations \(mnli, sst2\).*--dataset-config"):
        load_splits(repository, DatasetOptions(text_column="sentence"), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DatasetError, match=r"no configuration 'qqp'; its configurations are mnli, sst2"):
        load_splits(repository, DatasetOptions(config="qqp"), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DatasetError, match=r"directory of split files, which has no configurations"):
        load_splits(csv_dir, DatasetOptions(config="mnli"))
    with pytest.raises(DatasetError, match=r"`config` must be a dataset configuration name"):
        DatasetOptions(config="../mnli")


def test_a_hub_id_carries_its_configuration_to_the_hub_reader(
    repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hub is not reachable here: its id is answered from the local copy of the same repository, so
    # that what is checked is what cahp asks of `datasets` for a hub id (the configuration by name).
    datasets = pytest.importorskip("datasets")
    from cahp_engine.data import _hub as dataset_hub

    hub_id, asked, checked = "cahp-tests/glue-like", [], []
    builder, names = datasets.load_dataset_builder, datasets.get_dataset_config_names

    def from_the_local_copy(ref, *args, **kwargs):
        assert ref == hub_id
        asked.append(kwargs.get("name"))
        return builder(str(repository), *args, **{k: v for k, v in kwargs.items() if k not in ("revision", "token")})

    monkeypatch.setattr(datasets, "load_dataset_builder", from_the_local_copy)
    monkeypatch.setattr(datasets, "get_dataset_config_names", lambda ref, **_: names(str(repository)))
    # The local copy's files are local paths, which a real hub dataset's never are: record that the
    # resolved files are checked against the hub id rather than refusing them.
    monkeypatch.setattr(dataset_hub, "check_hub_data_files", lambda ref, files: checked.append((ref, len(files))))
    monkeypatch.chdir(tmp_path)  # no local folder of the hub id's name answers instead
    options = DatasetOptions(config="mnli", text_column="premise", text_pair_column="hypothesis")
    splits = load_splits(hub_id, options, cache_dir=str(tmp_path / "cache"))
    assert asked == ["mnli"] and splits.format == "hub" and splits.eval_split == "validation_matched"
    assert checked == [(hub_id, 4)]  # train, validation_matched, validation_mismatched, test_matched
    assert splits.train.text_pairs is not None and len(splits.train) == 12
    with pytest.raises(DatasetError, match=r"several configurations \(mnli, sst2\).*--dataset-config"):
        load_splits(hub_id, DatasetOptions(text_column="sentence"), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DatasetError, match=r"no configuration 'qqp'; its configurations are mnli, sst2"):
        load_splits(hub_id, DatasetOptions(config="qqp"), cache_dir=str(tmp_path / "cache"))
    assert asked == ["mnli"]  # refused before anything was fetched
