"""Ed25519 signatures on the audit chain and on every release folder (``cryptography``).

The signing key is a file outside the database (``PRIVRELEASE_SIGNING_KEY``: a PKCS#8 PEM
file, made by ``privrelease audit keygen``); its public key is published (the ``.pub`` file,
every release's ``chain-head.json`` and report). When the key is set, every audit record is
signed as it is appended and every release's head file signs the chain head together with the
sha256 of each file of the release. Every kind of signed object has its own domain prefix, so
a signature of one kind never passes for another:

* a record:  ``privrelease-record:<seq>:<hash>`` (the record hash covers its content and, by
  the chain, everything before it);
* a head file (``audit head --write``): ``privrelease-head:<seq>:<hash>``;
* a release: ``privrelease-release:`` + canonical JSON of ``{seq, hash, files, release}``,
  ``release`` binding the folder's name, the run id and the policy (name@version and sha256);
  a release head written before that binding lacks ``release`` and is reported as such;
* the witness (:mod:`.witness`): ``privrelease-witness:`` + canonical JSON of its heads;
* an approval (:mod:`.approvers`): ``privrelease-approval-v1`` and a newline, then its JSON.

A head file signed before heads had their own domain (with the record message) is refused:
the record's own signature would pass for it.

What it proves: a record or release signed with the key was written by a key holder. A writer
of the database without the key can still edit or delete rows, but every record it changes,
adds or rechains loses its valid signature (``audit verify --public-key``), and a release's
head file binds the chain as it was at publication (cut-offs show).
"""

from __future__ import annotations

import base64
import functools
import json
import os
from pathlib import Path
from typing import Any

from privrelease.errors import UserError
from privrelease.files import sha256_bytes

RECORD_DOMAIN = "privrelease-record"
HEAD_DOMAIN = "privrelease-head"
RELEASE_DOMAIN = "privrelease-release"
WITNESS_DOMAIN = "privrelease-witness"


def generate(path: Path) -> str:
    """Write a new private key to ``path`` (mode 0600, never overwritten) and its public key to
    ``path.pub``; return the public key (base64 of the 32 raw bytes)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise UserError(f"{str(path)!r} already exists: a signing key is never overwritten") from None
    except OSError as error:
        raise UserError(f"cannot write the key file {str(path)!r}: {error.strerror or error}") from None
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
    public = public_text(key)
    Path(f"{path}.pub").write_text(public + "\n", encoding="utf-8")
    return public


def public_text(key: Any) -> str:
    """The public key of a private key, as base64 of its 32 raw bytes."""
    return encode_public(key.public_key())


def encode_public(public: Any) -> str:
    """A public key as base64 of its 32 raw bytes (what :func:`decode_public` reads)."""
    from cryptography.hazmat.primitives import serialization

    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


@functools.lru_cache(maxsize=8)
def _load_private(path: str, mtime_ns: int, what: str = "PRIVRELEASE_SIGNING_KEY") -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as error:
        raise UserError(f"{what}={path!r} is not a readable unencrypted PEM key: {error}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise UserError(f"{what}={path!r} is not an Ed25519 key (privrelease audit keygen makes one)")
    return key


def private_key(path: str, what: str) -> Any:
    """The Ed25519 private key in the PKCS#8 PEM file ``path`` (cached while the file is
    unchanged); a UserError naming ``what`` (the setting or option) otherwise."""
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError as error:
        raise UserError(f"{what}={path!r}: {error.strerror or error}") from None
    return _load_private(path, mtime, what)


def decode_public(text: str) -> Any | None:
    """An Ed25519 public key from base64 of its 32 raw bytes (the ``.pub`` file's text), or None."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(text.strip(), validate=True))
    except (ValueError, TypeError):
        return None


def fingerprint(text: str) -> str:
    """A public key's fingerprint: the first 16 hex digits of the sha256 of its raw bytes
    (``text``: base64 of them); of the text itself when it is not base64."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raw = text.encode("utf-8")
    return sha256_bytes(raw)[:16]


def public_key(text_or_path: str) -> Any:
    """A public key from its base64 text or a ``.pub`` file holding it; UserError otherwise."""
    text = text_or_path.strip()
    if Path(text).is_file():
        text = Path(text).read_text(encoding="utf-8").strip()
    key = decode_public(text)
    if key is None:
        raise UserError(
            f"--public-key {text_or_path!r} is neither an Ed25519 public key (base64 of 32 bytes) nor a file holding one"
        )
    return key


def record_message(seq: int, digest: str) -> bytes:
    return f"{RECORD_DOMAIN}:{seq}:{digest}".encode("ascii")


def head_message(seq: int, digest: str) -> bytes:
    return f"{HEAD_DOMAIN}:{seq}:{digest}".encode("ascii")


def _json(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def release_message(seq: int, digest: str, files: dict[str, str], release: dict[str, str] | None = None) -> bytes:
    """``release`` None: the message of a release head written before the run binding."""
    body: dict[str, Any] = {"seq": seq, "hash": digest, "files": files}
    if release is not None:
        body["release"] = release
    return f"{RELEASE_DOMAIN}:{_json(body)}".encode()


def witness_message(body: dict[str, Any]) -> bytes:
    return f"{WITNESS_DOMAIN}:{_json(body)}".encode()


def sign(key: Any, message: bytes) -> str:
    return base64.b64encode(key.sign(message)).decode("ascii")


def valid(key: Any, message: bytes, signature: str | None) -> bool:
    """True when ``signature`` (base64) is ``key``'s signature of ``message``."""
    from cryptography.exceptions import InvalidSignature

    if not signature:
        return False
    try:
        key.verify(base64.b64decode(signature, validate=True), message)
    except (InvalidSignature, ValueError):
        return False
    return True
