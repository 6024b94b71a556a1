"""API keys: each key belongs to a tenant; only sha256 digests of keys are ever kept.

Keys come from `AUTOFUSION_API_KEYS` (`tenant:key` or `tenant:sha256:<hex>`) or, only when that is
unset, from a key file in the data dir that `autofusion serve` creates when no key is configured.
Lookup hashes the presented key and compares digests, so neither the process nor the disk holds a usable key.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from autofusion_core.files import private_dir
from autofusion_core.keys import hash_key, parse_api_keys
from autofusion_core.settings import Settings

KEY_FILE = "api_keys.json"
DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class KeyRing:
    """Key digests → tenants."""

    tenants_by_digest: dict[str, str]

    def tenant_for(self, key: str) -> str | None:
        presented = hash_key(key)
        for digest, tenant in self.tenants_by_digest.items():
            if hmac.compare_digest(presented, digest):
                return tenant
        return None


def load_keyring(settings: Settings) -> KeyRing:
    """The configured keys. `AUTOFUSION_API_KEYS`, when set, *replaces* the key file: an operator
    who configures keys (say, after `serve` once generated one) means exactly those keys, so a
    generated key left in the data dir must stop working rather than keep tenant `default` open."""
    if settings.api_keys.strip():
        return KeyRing(parse_api_keys(settings.api_keys))
    key_file = settings.data_dir / KEY_FILE
    table: dict[str, str] = {}
    if key_file.is_file():
        for item in json.loads(key_file.read_text()):
            table.setdefault(item["sha256"], item["tenant"])
    return KeyRing(table)


def ensure_key(settings: Settings) -> str | None:
    """With no configured key and no key file, create one key, store its hash, and return the key
    (the caller prints it once). Returns None when keys already exist.

    Several replicas may start at once on a fresh shared volume, so creation is one atomic step, an
    `O_EXCL` create: exactly one replica makes the file (and prints its key); a loser discards its
    key and waits until the winner's file is complete, so that its key ring holds the winner's key."""
    key_file: Path = settings.data_dir / KEY_FILE
    if settings.api_keys.strip() or key_file.is_file():
        return None
    key = "af_" + secrets.token_urlsafe(32)
    data = json.dumps([{"tenant": DEFAULT_TENANT, "sha256": hash_key(key)}], indent=2).encode()
    private_dir(settings.data_dir)
    try:
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        _wait_for_key_file(key_file)
        return None
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


def _wait_for_key_file(key_file: Path, timeout: float = 10.0) -> None:
    """Wait for another process's key file to hold its whole content (it writes it right after
    creating it), so that `load_keyring` never reads it half-written."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if json.loads(key_file.read_bytes() or b"null"):
                return
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{key_file} exists but holds no key list; remove it and restart")
        time.sleep(0.02)
