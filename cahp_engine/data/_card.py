"""A dataset repository's YAML (``README.md`` front matter, ``.huggingface.yaml``), checked before ``datasets``.

``datasets.load_dataset(directory)`` takes a repository's ``configs`` from both files (the second
overrides the first) and opens whatever their ``data_files`` and ``data_dir`` name. Here every such
entry, in every configuration, must be a relative path or glob inside the directory
(:func:`cahp_engine.data.data_file_problem`); malformed YAML is refused with a message
rather than left to fail somewhere inside ``datasets``. The functions take the files' text, so the
job service can check a card it reads from an archive before anything is unpacked.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cahp_engine._validation import excerpt
from cahp_engine.data._paths import check_links_inside, data_file_problem
from cahp_engine.errors import DatasetError

#: The files whose YAML ``datasets`` reads from a dataset directory, in the order it merges them.
CARD_FILES: tuple[str, ...] = ("README.md", ".huggingface.yaml")
#: Longest entry quoted in a message.
_QUOTED = 200
#: Deepest nesting of mappings and lists read from a card's YAML (a real card nests five or six deep).
MAX_YAML_DEPTH = 64
_CONFIGS_KEY = re.compile(r"\bconfigs['\"]?[ \t]*:")


def card_metadata(name: str, text: str, *, where: str) -> dict[str, Any] | None:
    """The YAML mapping of the card file ``name`` (one of :data:`CARD_FILES`), or None when it has none.

    ``README.md`` is split from its front matter with ``huggingface_hub``'s own pattern, the one
    ``datasets`` uses, so both see the same YAML.

    Raises
    ------
    DatasetError
        When the YAML cannot be parsed or is not a mapping.
    """
    text = text.removeprefix("\ufeff")
    if name == CARD_FILES[0]:
        from huggingface_hub.repocard import REGEX_YAML_BLOCK

        match = REGEX_YAML_BLOCK.search(text)
        if match is None:
            return None
        text = match.group(2)
    import yaml

    try:
        loader = _bounded_loader()(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise DatasetError(
            f"{where}: the YAML{' front matter' if name == CARD_FILES[0] else ''} cannot be parsed{at} "
            f"({getattr(err, 'problem', None) or type(err).__name__}); fix it, or remove it if the dataset is a "
            "directory of split files"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DatasetError(
            f"{where}: the YAML must be a mapping of keys such as `configs`, not a {type(data).__name__}"
        )
    return data


def _bounded_loader() -> type:
    """PyYAML's safe loader that refuses aliases and nesting deeper than :data:`MAX_YAML_DEPTH`.

    An alias is a reference to an earlier node: eight levels of nine aliases stand for 43 million
    entries in three kilobytes, which any code that walks or prints the result then expands. Cards
    have no use for them, so none is accepted; without aliases, the document's size bounds its data.
    """
    import yaml
    from yaml.composer import ComposerError

    class BoundedLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise ComposerError(None, None, "aliases (*name) are not accepted; write the value out",
                                    self.peek_event().start_mark)
            self.depth += 1
            try:
                if self.depth > MAX_YAML_DEPTH:
                    raise ComposerError(None, None, f"it nests deeper than {MAX_YAML_DEPTH} levels",
                                        self.peek_event().start_mark)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return BoundedLoader


def check_card_metadata(data: dict[str, Any], *, where: str) -> bool:
    """Check a card's ``configs`` and ``dataset_info``; returns whether it lists ``configs``.

    Every ``data_files`` entry (a string, a list, a list of ``{split, path}``, or a split-to-paths
    mapping) and every ``data_dir`` must be a relative path or glob that stays in the directory.

    Raises
    ------
    DatasetError
        Naming the configuration and the entry, and saying what is accepted.
    """
    info = data.get("dataset_info")
    if info is not None and not (isinstance(info, dict) or (isinstance(info, list) and
                                                           all(isinstance(i, dict) for i in info))):
        raise DatasetError(
            f"{where}: `dataset_info` must be a mapping (or a list of mappings, one per configuration), "
            f"not a {type(info).__name__}"
        )
    configs = data.get("configs")
    if configs is None:
        return False
    if not isinstance(configs, list):
        raise DatasetError(f"{where}: `configs` must be a list of configurations, not a {type(configs).__name__}")
    for config in configs:
        if not isinstance(config, dict) or not isinstance(config.get("config_name"), str):
            raise DatasetError(
                f"{where}: each entry of `configs` must be a mapping with a `config_name`, "
                f"got {str(config)[:_QUOTED]!r}"
            )
        name = config["config_name"]
        if "data_dir" in config:
            _check_entry(config["data_dir"], "`data_dir`", name, where)
        if "data_files" in config:
            for entry in _data_file_entries(config["data_files"], name, where):
                _check_entry(entry, "data file", name, where)
    return True


def check_card_text(name: str, text: str, *, where: str) -> bool:
    """:func:`card_metadata` then :func:`check_card_metadata`; whether the card lists ``configs``."""
    data = card_metadata(name, text, where=where)
    return data is not None and check_card_metadata(data, where=where)


def mentions_configs(text: str) -> bool:
    """Whether ``text`` has something like a ``configs:`` key (a hint, for YAML too broken to parse)."""
    return _CONFIGS_KEY.search(text) is not None


def has_card_configs(root: Path) -> bool:
    """Whether ``root``'s ``README.md`` front matter or ``.huggingface.yaml`` lists ``configs``.

    A card whose YAML cannot be parsed counts when a line of it names ``configs`` (reading it then
    reports the problem); otherwise it is an ordinary README of a directory of split files.
    """
    for name in CARD_FILES:
        path = root / name
        if path.is_symlink() or not path.is_file():
            continue  # never read through a link here; check_repository refuses a linked card
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            data = card_metadata(name, text, where=str(path))
        except DatasetError:
            if mentions_configs(text):
                return True
            continue
        if data is not None and "configs" in data:
            return True
    return False


def check_repository(root: Path) -> None:
    """Check a repository directory before ``datasets`` reads it: its cards' YAML, and no link out of it.

    Raises
    ------
    DatasetError
        For malformed YAML, a ``data_files`` or ``data_dir`` entry that is not a relative path
        inside ``root``, or a link in ``root`` that leads out of it.
    """
    for name in CARD_FILES:
        path = root / name
        if not (path.exists() or path.is_symlink()):
            continue
        if path.is_symlink() or not path.is_file():
            raise DatasetError(f"{path} is not a regular file; copy the file itself into the dataset directory")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise DatasetError(f"{path} is not UTF-8; save it again as UTF-8") from None
        check_card_text(name, text, where=str(path))
    check_links_inside(root)


def _data_file_entries(value: Any, config: str, where: str) -> list[Any]:
    """Every path of a ``data_files`` value, in any of the forms ``datasets`` accepts."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [p for paths in value.values() for p in (paths if isinstance(paths, list) else [paths])]
    if isinstance(value, list):
        entries: list[Any] = []
        for item in value:
            if isinstance(item, dict):
                if "path" not in item:
                    raise DatasetError(
                        f"{where}: configuration {config!r} has a `data_files` entry without a `path`: "
                        f"{str(item)[:_QUOTED]!r}; write each as {{split: train, path: data/train-*.csv}}"
                    )
                paths = item["path"]
                entries.extend(paths if isinstance(paths, list) else [paths])
            else:
                entries.append(item)
        return entries
    raise DatasetError(
        f"{where}: configuration {config!r} has `data_files` of type {type(value).__name__}; give a path, a list "
        "of paths, or a list of {split, path} entries"
    )


def _check_entry(entry: Any, what: str, config: str, where: str) -> None:
    problem = data_file_problem(entry)
    if problem is not None:
        shown = entry[:_QUOTED] if isinstance(entry, str) else excerpt(entry, _QUOTED)
        raise DatasetError(
            f"{where}: configuration {config!r} names the {what} {shown!r}, which {problem}; cahp reads only "
            "files inside the dataset directory, named relative to it (like data/train-*.parquet)"
        )
