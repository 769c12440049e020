"""The command line of ``python -m bench`` and ``python -m studies``: pick one module by name and run it."""

from __future__ import annotations

import importlib
import os
import sys


def run_named(commands: dict[str, str], *, prog: str, other: str) -> None:
    """Run ``commands[argv[1]].main(argv[2:])``, or print the usage (naming ``other``) and exit 2."""
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(f"usage: {prog} {{" + "|".join(commands) + f"}} [options]\n({other})", file=sys.stderr)
        sys.exit(2)
    # Set before any module of the command imports transformers or tokenizers.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    importlib.import_module(commands[sys.argv[1]]).main(sys.argv[2:])
