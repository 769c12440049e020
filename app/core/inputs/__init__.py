"""What a job reads and how it is checked: references by URI scheme, archives, uploads' contents, preflight.

Reading order: ``sources`` (one module per URI scheme: ``check_reference`` at submit, ``fetch_reference``
in the worker) -> ``_archives`` (safe unpacking) -> ``_upload_contents`` (what an upload holds, indexed
when it arrives) -> ``_dataset_checks`` and ``_preflight`` (the model and dataset checked at submit, as the
worker would) -> ``_local`` (a job's references to local directories) -> ``_naming`` (what an input is
called).

The public names are declared in ``__init__.pyi`` and loaded on first use (SPEC 1 lazy loading), as in
the engine's rooms."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
