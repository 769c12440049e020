"""The inspection sandbox: every read of untrusted content runs in a bounded child process.

What it holds and its reading order are in ``__init__.pyi``, which declares the public names; they are
loaded on first use (SPEC 1 lazy loading), as in the engine's rooms."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
