"""The inspection sandbox: every read of untrusted content runs in a bounded child process.

:func:`inspection_pool` gives the pool of a deployment's settings; :mod:`app.core.sandbox._tasks`
holds what a child may be asked to do (index an upload, check a job's inputs), each returning plain
data. See :mod:`app.core.sandbox._pool` for the limits and what reaching each one answers.


Reading order: ``_frames`` (the length-prefixed JSON both ways) -> ``_child`` (the child's loop and its
own limits) -> ``_pool`` (the parent's side: limits, wall time, replacing a broken child) -> ``_tasks``
(what a child may do) -> ``_pools`` (the process's pools by settings).

The public names are declared in ``__init__.pyi`` and loaded on first use (SPEC 1 lazy loading), as in
the engine's rooms."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
