"""The API process's background loops, beside its HTTP side: what runs without a request.

Reading order: ``_producer`` (``JobQueue``: sends a job's task by name) -> ``_broker_probe`` (which jobs
wait in the broker) -> ``_sweeper`` (re-sends jobs the broker lost, fails expired leases, expires
artifacts) -> ``_dispatcher`` with ``_webhook_http`` (webhook deliveries from the outbox, through the
outbound guard).

The public names are declared in ``__init__.pyi`` and loaded on first use (SPEC 1 lazy loading), as in
the engine's rooms."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
