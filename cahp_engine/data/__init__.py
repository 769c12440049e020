"""Reading labelled datasets and turning them into token batches.

Reading order: ``_options`` (which columns and splits) -> ``_files`` / ``_hub`` (the sources) -> ``_table``
-> ``_splits`` (``load_splits``) -> ``_encoding`` (tokenise, batch) -> ``_lazy`` (tokenise on read).

The public names are declared in ``__init__.pyi`` and loaded on first use (SPEC 1 lazy loading), so
importing one name does not import the whole room."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
