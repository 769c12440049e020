"""Dataset folders written for the data tests: CSV files and a hub-style repository with configurations."""

from __future__ import annotations

from pathlib import Path


def write_csv(path: Path, text: str) -> Path:
    """``text`` at ``path``, its folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_glue_like_dataset(root: Path) -> Path:
    """A script-free hub-style dataset repository with two configurations, like GLUE's ``mnli`` and ``sst2``.

    ``mnli`` has ``validation_matched``/``validation_mismatched`` and an unlabelled ``test_matched``
    (every label -1); ``sst2`` has ``validation`` and an unlabelled ``test``.
    """
    pairs = [("a fine film", "it is good", 0), ("a dull film", "it is bad", 1), ("a film", "it exists", 2)]
    splits = {
        "mnli": {"train": pairs * 4, "validation_matched": pairs, "validation_mismatched": pairs[::-1],
                 "test_matched": [(p, h, -1) for p, h, _ in pairs]},
        "sst2": {"train": [("good", 1), ("bad", 0)] * 4, "validation": [("fine", 1), ("poor", 0)],
                 "test": [("unknown", -1), ("hidden", -1)]},
    }
    lines = ["---", "configs:"]
    for config, parts in splits.items():
        lines += [f"- config_name: {config}", "  data_files:"]
        for split, rows in parts.items():
            header = "premise,hypothesis,label" if config == "mnli" else "sentence,label"
            body = "\n".join(",".join(str(v) for v in row) for row in rows)
            write_csv(root / config / f"{split}.csv", f"{header}\n{body}\n")
            lines += [f"  - split: {split}", f"    path: {config}/{split}.csv"]
    (root / "README.md").write_text("\n".join([*lines, "---", "# a GLUE-like repository", ""]))
    return root
