"""Ed25519 keys for the audit trail: key text, key ids, and signing / checking one chain row.

A row is signed over ``gpuledger-audit-v1|<key id>|<seq>|<hash>``: its hash already covers its
fields and, through ``prev_hash``, every row before it, so one good signature vouches for the
whole chain up to that row. The private key never enters the database; rows keep the key id and
the signature.

Key text (one line; files may hold ``#`` comments):

- private: ``ed25519-private:<base64 of the 32-byte seed>`` (``gpuledger audit key new``);
- public: ``ed25519:<base64 of the 32-byte public key>``, optionally followed by
  ``retired-after=SEQ``: the key signed rows up to SEQ and no later one (after a rotation).

A key id is the first 16 hex digits of the sha256 of the raw public key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PRIVATE_PREFIX = "ed25519-private:"
PUBLIC_PREFIX = "ed25519:"
RETIRED = "retired-after="
DOMAIN = b"gpuledger-audit-v1"


class KeyTextError(ValueError):
    """Key text that cannot be read (a ValueError: the CLI shows it as one line)."""


def _raw(text: str, prefix: str) -> bytes:
    body = text[len(prefix) :].strip()
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise KeyTextError(f"not a gpuledger audit key: the part after {prefix!r} is not base64") from None
    if len(raw) != 32:
        raise KeyTextError(f"not a gpuledger audit key: expected 32 bytes after {prefix!r}, got {len(raw)}")
    return raw


def key_id_of(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


def message(key_id: str, seq: int, row_hash: str) -> bytes:
    return b"|".join((DOMAIN, key_id.encode(), str(int(seq)).encode(), row_hash.encode()))


@dataclass(frozen=True)
class PublicKey:
    key_id: str
    raw: bytes
    retired_after: int | None = None  # the last seq this key may have signed (None: still in use)

    @property
    def text(self) -> str:
        return PUBLIC_PREFIX + base64.b64encode(self.raw).decode()

    def may_sign(self, seq: int) -> bool:
        return self.retired_after is None or seq <= self.retired_after

    def verify(self, seq: int, row_hash: str, signature: str | None) -> bool:
        """Whether ``signature`` (base64) is this key's signature of row ``seq`` with ``row_hash``,
        made while the key was in use."""
        if not signature or not self.may_sign(seq):
            return False
        try:
            sig = base64.b64decode(signature, validate=True)
            Ed25519PublicKey.from_public_bytes(self.raw).verify(sig, message(self.key_id, seq, row_hash))
        except (InvalidSignature, binascii.Error, ValueError):
            return False
        return True

    def verify_text(self, text: bytes, signature: str | None) -> bool:
        """Whether ``signature`` (base64) is this key's signature of ``text`` (a checkpoint's
        message, which starts with a domain of its own, never with DOMAIN)."""
        if not signature or text.startswith(DOMAIN + b"|"):
            return False
        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(base64.b64decode(signature, validate=True), text)
        except (InvalidSignature, binascii.Error, ValueError):
            return False
        return True


class SigningKey:
    """A private key: signs rows. Its public half is ``public``."""

    def __init__(self, seed: bytes) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        raw = self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public = PublicKey(key_id_of(raw), raw)

    @classmethod
    def generate(cls) -> SigningKey:
        key = Ed25519PrivateKey.generate()
        return cls(key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                     serialization.NoEncryption()))  # fmt: skip

    @property
    def key_id(self) -> str:
        return self.public.key_id

    @property
    def text(self) -> str:
        seed = self._key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        return PRIVATE_PREFIX + base64.b64encode(seed).decode()

    def sign(self, seq: int, row_hash: str) -> str:
        return base64.b64encode(self._key.sign(message(self.key_id, seq, row_hash))).decode()

    def sign_text(self, text: bytes) -> str:
        """A signature of other text (a checkpoint): never of a row's message, so it cannot stand for one."""
        if text.startswith(DOMAIN + b"|"):
            raise ValueError("sign_text signs other messages than audit rows")
        return base64.b64encode(self._key.sign(text)).decode()


def _lines(text: str) -> list[str]:
    return [ln.split("#", 1)[0].strip() for ln in text.splitlines() if ln.split("#", 1)[0].strip()]


def parse_private(text: str) -> SigningKey:
    lines = _lines(text)
    if len(lines) != 1 or not lines[0].startswith(PRIVATE_PREFIX):
        raise KeyTextError(f"not a gpuledger audit private key: expected one line starting with {PRIVATE_PREFIX!r}")
    return SigningKey(_raw(lines[0], PRIVATE_PREFIX))


def parse_public(line: str) -> PublicKey:
    """One public key line; a private key line gives its public half."""
    line = line.strip()
    if line.startswith(PRIVATE_PREFIX):
        return SigningKey(_raw(line.split()[0], PRIVATE_PREFIX)).public
    if not line.startswith(PUBLIC_PREFIX):
        raise KeyTextError(
            f"not a gpuledger audit key: expected {PUBLIC_PREFIX!r}<base64> (gpuledger audit key public)"
        )
    parts = line.split()
    retired = None
    for extra in parts[1:]:
        if not extra.startswith(RETIRED) or not extra[len(RETIRED) :].isdigit():
            raise KeyTextError(f"unknown key option {extra!r}; the only one is {RETIRED}SEQ")
        retired = int(extra[len(RETIRED) :])
    raw = _raw(parts[0], PUBLIC_PREFIX)
    return PublicKey(key_id_of(raw), raw, retired)


@dataclass(frozen=True)
class Keyring:
    """The public keys a reader trusts, by key id."""

    keys: dict[str, PublicKey]

    @classmethod
    def of(cls, keys: Iterable[PublicKey]) -> Keyring:
        out: dict[str, PublicKey] = {}
        for k in keys:
            known = out.get(k.key_id)
            if known is None or known.retired_after is None:  # the same key twice: a retirement wins
                out[k.key_id] = k
        return cls(out)

    @classmethod
    def parse(cls, text: str) -> Keyring:
        return cls.of(parse_public(line) for line in _lines(text))

    def __bool__(self) -> bool:
        return bool(self.keys)

    def verify(self, seq: int, key_id: str | None, row_hash: str, signature: str | None) -> bool:
        key = self.keys.get(key_id or "")
        return key is not None and key.verify(seq, row_hash, signature)

    def describe(self) -> str:
        return ", ".join(
            k.key_id + ("" if k.retired_after is None else f" (retired after seq {k.retired_after})")
            for k in self.keys.values()
        )
