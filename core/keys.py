"""API key syntax, shared so that the settings model can validate `AUTOFUSION_API_KEYS` at start.

Only sha256 digests of keys are compared or kept; the service's `auth` module builds its key ring
from these tables.
"""

from __future__ import annotations

import hashlib
import re

_TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_HEX = re.compile(r"^[0-9a-f]{64}$")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_api_keys(spec: str) -> dict[str, str]:
    """`tenant:key,tenant:sha256:<hex>` → {key digest: tenant}. Raises ValueError on a bad entry."""
    table: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        tenant, sep, key = entry.partition(":")
        if not sep or not key or not _TENANT.match(tenant):
            raise ValueError(f"AUTOFUSION_API_KEYS entries must be 'tenant:key', got {entry[:24]!r}…")
        digest = key.removeprefix("sha256:") if key.startswith("sha256:") else hash_key(key)
        if not _HEX.match(digest):
            raise ValueError(f"tenant {tenant!r}: 'sha256:' must be followed by 64 lowercase hex digits")
        table[digest] = tenant
    return table
