"""Who may call and where the service may reach: API keys, signed links and the outbound guard.

Reading order: ``_hashing`` (key and webhook-secret generation and hashing) -> ``_keys`` (creating,
listing, revoking and authenticating keys, with the short-lived cache) -> ``_signing`` (time-limited
artifact links: S3 presigned or HMAC-signed) -> ``_outbound`` (the guard on every URL the service
fetches or posts to)."""

from ._hashing import (
    KEY_PREFIX,
    LOCAL_PRINCIPAL_ID,
    NewKey,
    generate_key,
    generate_webhook_secret,
    hash_key,
    key_id_of,
    key_matches,
)
from ._keys import (
    LAST_USED_EVERY_S,
    KeyCache,
    KeyInfo,
    Principal,
    authenticate,
    create_api_key,
    list_keys,
    revoke_key,
)
from ._outbound import (
    GLOBAL_UNICAST_V6,
    NAT64,
    OWN,
    RECEIVER_REFUSED_NETWORKS,
    REFUSED_NAMES,
    REFUSED_NETWORKS,
    IPAddress,
    Resolver,
    check_address,
    check_hub_endpoint,
    check_outbound_url,
    check_webhook_url,
    interface_addresses,
    refused_kind,
    refused_reason,
)
from ._signing import (
    KEY_FILE,
    LINK_PREFIX,
    ArtifactRef,
    SignedLink,
    artifact_link,
    check_local_link,
    local_link,
    signing_key,
)

__all__ = [
    "artifact_link", "ArtifactRef", "authenticate", "check_address", "check_hub_endpoint", "check_local_link",
    "check_outbound_url", "check_webhook_url", "create_api_key", "generate_key", "generate_webhook_secret",
    "GLOBAL_UNICAST_V6", "hash_key", "interface_addresses", "IPAddress", "KEY_FILE", "key_id_of", "key_matches",
    "KEY_PREFIX", "KeyCache", "KeyInfo", "LAST_USED_EVERY_S", "LINK_PREFIX", "list_keys", "local_link",
    "LOCAL_PRINCIPAL_ID", "NAT64", "NewKey", "OWN", "Principal", "RECEIVER_REFUSED_NETWORKS", "refused_kind",
    "REFUSED_NAMES", "REFUSED_NETWORKS", "refused_reason", "Resolver", "revoke_key", "SignedLink",
    "signing_key",
]
