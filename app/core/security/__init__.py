"""Who may call and where the service may reach: API keys, signed links and the outbound guard.

Reading order: ``_hashing`` (key and webhook-secret generation and hashing) -> ``_keys`` (creating,
listing, revoking and authenticating keys, with the short-lived cache) -> ``_signing`` (time-limited
artifact links: S3 presigned or HMAC-signed) -> ``_outbound`` (the guard on every URL the service
fetches or posts to).

The public names are declared in ``__init__.pyi`` and loaded on first use (SPEC 1 lazy loading), as in
the engine's rooms."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
