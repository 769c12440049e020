"""Who may call and where the service may reach: API keys, signed links and the outbound guard.

Reading order: ``_hashing`` (key and webhook-secret generation and hashing) -> ``_keys`` (creating,
listing, revoking and authenticating keys, with the short-lived cache) -> ``_signing`` (time-limited
artifact links: S3 presigned or HMAC-signed) -> ``_outbound`` (the guard on every URL the service
fetches or posts to)."""

from ._hashing import LOCAL_PRINCIPAL_ID, generate_key, generate_webhook_secret, hash_key, key_id_of
from ._keys import KeyCache, Principal, authenticate, create_api_key, list_keys, revoke_key
from ._outbound import check_address, check_hub_endpoint, check_outbound_url, check_webhook_url, hide_credentials
from ._signing import KEY_FILE, ArtifactRef, artifact_link, check_local_link, local_link

__all__ = [
    "artifact_link", "ArtifactRef", "authenticate", "check_address", "check_hub_endpoint", "check_local_link",
    "check_outbound_url", "check_webhook_url", "create_api_key", "generate_key", "generate_webhook_secret",
    "hash_key", "hide_credentials", "KEY_FILE", "key_id_of", "KeyCache", "list_keys", "local_link",
    "LOCAL_PRINCIPAL_ID", "Principal", "revoke_key",
]
