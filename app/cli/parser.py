"""The argument parser every ``cahp`` command is built with: whole flag names only, and "did you mean".

argparse accepts any unambiguous prefix of a flag by default, so ``--epoch 1`` silently became
``--epochs 1``; every parser here is made with ``allow_abbrev=False``. An unknown flag is reported by
the subcommand it was given to, with its usage and the nearest flags it has (``--poly_degree``:
did you mean ``--poly-degree``?), rather than by the top-level parser, whose usage says nothing of the
subcommand's flags. A misspelt flag is named even when a required argument is missing too (often the
one it misspells: ``--ouput`` for ``--output``), where argparse would stop at the missing one. Light: no torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from cahp_engine.config import did_you_mean


class CahpParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` without abbreviations, whose subcommands report their own unknown flags."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._given: list[str] = []

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        # What this parser was given, for error(): a subcommand's parser gets the words after its name.
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> Any:  # NoReturn
        if message.startswith("the following arguments are required"):
            unknown = self._unknown_flag(self._given)
            if unknown:
                message += f"; unrecognized arguments: {unknown}{_hint(self, unknown)}"
        super().error(message)

    def _unknown_flag(self, words: Sequence[str]) -> str:
        """The first word that looks like a flag and is none of this parser's ("" when none).

        A word argparse reads as a positional or a value is none: ``-`` alone, one with a space, a
        negative number, and a short flag with its value attached (``-o/tmp/out``).
        """
        for word in words:
            if word == "--":
                break
            name = word.split("=", 1)[0]
            if len(word) < 2 or word[0] not in self.prefix_chars or " " in word \
                    or self._negative_number_matcher.match(name) or name in self._option_string_actions:
                continue
            if word[1] not in self.prefix_chars and word[:2] in self._option_string_actions:
                continue
            return name
        return ""

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            chosen = self._chosen(parsed)
            unknown = next((e.split("=", 1)[0] for e in extras if e.startswith("-")), "")
            hint = _hint(chosen, unknown) if unknown else ""
            chosen.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed

    def _chosen(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost subcommand's parser that ``parsed`` went through (``self`` without subcommands)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(sub, CahpParser):
                    return sub._chosen(parsed)
                if sub is not None:
                    return sub
        return self


def _hint(parser: argparse.ArgumentParser, unknown: str) -> str:
    """``; did you mean --epochs?`` for an unknown flag of ``parser``: its nearest flags, else the setting it names."""
    flags = [s for action in parser._actions for s in action.option_strings]
    hint = did_you_mean(unknown, flags)
    if not hint and "--param" in flags:
        hint = _param_hint(unknown)
    return hint


def _param_hint(flag: str) -> str:
    """``; did you mean --param epochs=VALUE?`` for a flag that names a setting (``--epoch``, ``--dense-lr``)."""
    import dataclasses

    from cahp_engine.config import PruningConfig

    names = [f.name for f in dataclasses.fields(PruningConfig)]
    near = did_you_mean(flag.lstrip("-"), names)
    if not near:
        return ""
    word = flag.lstrip("-").replace("-", "_")
    found = word if word in names else near.removeprefix("; did you mean ").removesuffix("?").split(" or ")[0]
    return f"; did you mean --param {found}=VALUE?"


def shared_flags() -> CahpParser:
    """A parent parser (``parents=[...]``) for flags several subcommands share."""
    return CahpParser(add_help=False)
