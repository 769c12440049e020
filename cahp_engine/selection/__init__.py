"""Choosing the heads to keep: CAHP's analysis of a model and the strategies that choose from it.

Its reading order and public names are in ``__init__.pyi``; the names are loaded on first use (SPEC 1
lazy loading), so importing one name does not import the whole room."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
