"""The argument parser every ``cahp`` command is built with: whole flag names only, and "did you mean".

argparse accepts any unambiguous prefix of a flag by default, so ``--epoch 1`` silently became
``--epochs 1``; every parser here is made with ``allow_abbrev=False``. An unknown flag is reported by
the subcommand it was given to, with its usage and the nearest flags it has (``--poly_degree``:
did you mean ``--poly-degree``?), rather than by the top-level parser, whose usage says nothing of the
subcommand's flags. Light: no torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from cahp_engine.config import did_you_mean


class CahpParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` without abbreviations, whose subcommands report their own unknown flags."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            chosen = self._chosen(parsed)
            flags = [s for action in chosen._actions for s in action.option_strings]
            unknown = next((e.split("=", 1)[0] for e in extras if e.startswith("-")), "")
            hint = did_you_mean(unknown, flags) if unknown else ""
            if unknown and not hint and "--param" in flags:
                hint = _param_hint(unknown)
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
