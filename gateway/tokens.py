"""Ephemeral client secrets: short-lived tokens a browser uses in place of an API key.

    value = "ek_" + base64url( version:1 | expires_at:8 | key_id:16 | mac:32 )
    mac    = HMAC-SHA256(secret, "tokenwire-ek" | version | expires_at | key_id)
    key_id = HMAC-SHA256(secret, "key-id" | owner)[:16]    owner: the key's SHA-256

Stateless: any replica holding the same secret accepts a token another minted, and
nothing is stored. The key id is keyed by the secret, so a token does not reveal which
key made it (nor the key's hash, which would let a weak key be guessed offline); it maps
back only to a key still configured, so removing a key revokes its tokens too.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import struct

PREFIX = "ek_"
_VERSION = 1
_HEAD = struct.Struct(">BQ16s")  # version, expires_at (unix seconds), key id
_MAC_BYTES = 32
_NO_OWNER = b"\x00"  # the key id's input when auth is off (no key minted it)


class TokenRefused(Exception):
    """A client secret that cannot be used; the message says why (never the token)."""


class ClientSecrets:
    """Mints and checks ephemeral client secrets for the keys in `key_hashes`.

    `secret`: the HMAC key, shared by every replica that must accept the same tokens;
    empty makes a random one, good for this process only."""

    def __init__(self, secret: str, key_hashes: frozenset[str]):
        self._secret = secret.encode() if secret else secrets.token_bytes(32)
        self._owners = {self._key_id(owner): owner for owner in key_hashes}

    def mint(self, owner: str | None, expires_at: int) -> str:
        """A token acting as `owner` (None: no auth) until `expires_at` (unix seconds)."""
        head = _HEAD.pack(_VERSION, expires_at, self._key_id(owner))
        return PREFIX + _b64(head + self._mac(head))

    def owner(self, value: str, now: float) -> str:
        """The owner `value` acts as; TokenRefused if it is forged, altered, expired, or
        its key is no longer accepted."""
        raw = _unb64(value.removeprefix(PREFIX))
        if raw is None or len(raw) != _HEAD.size + _MAC_BYTES:
            raise TokenRefused("a client secret that is not valid")
        head, mac = raw[:_HEAD.size], raw[_HEAD.size:]
        if not hmac.compare_digest(mac, self._mac(head)):
            raise TokenRefused("a client secret that is not valid")
        version, expires_at, key_id = _HEAD.unpack(head)
        if version != _VERSION:
            raise TokenRefused("a client secret that is not valid")
        if expires_at <= now:
            raise TokenRefused("an expired client secret")
        if key_id not in self._owners:
            raise TokenRefused("a client secret of a key that is no longer accepted")
        return self._owners[key_id]

    def _key_id(self, owner: str | None) -> bytes:
        data = b"key-id" + (owner.encode() if owner is not None else _NO_OWNER)
        return hmac.new(self._secret, data, hashlib.sha256).digest()[:16]

    def _mac(self, head: bytes) -> bytes:
        return hmac.new(self._secret, b"tokenwire-ek" + head, hashlib.sha256).digest()


def is_token(value: str) -> bool:
    return value.startswith(PREFIX)


def _b64(data: bytes) -> str:
    # No padding: "=" may not appear in a WebSocket subprotocol, where browsers send it.
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
