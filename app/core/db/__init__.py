"""The job database: the engine and sessions, the tables, and every read and write of them.

Reading order: ``_database`` (``make_engine``, ``transaction``, ``upgrade_database``: SQLAlchemy and
Alembic) -> ``_models`` (the tables: ``Job``, ``ApiKey``, ``Upload``, ``Artifact``...) -> ``repository``
(every state change as a conditional ``UPDATE``; callers write ``repository.claim_job(...)``).

The public names are declared in ``__init__.pyi`` and loaded on first use (SPEC 1 lazy loading), as in
the engine's rooms."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
