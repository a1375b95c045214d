"""sr25519 signing keys for the Substrate transports, from every form an operator keeps them in.

Accepted: `//Alice`-style dev URIs, BIP39 mnemonics (optionally followed by a `//hard/soft`
derivation path), a 0x-prefixed 32-byte seed, and polkadot.js encrypted JSON keystores (a file
path, with a password). Errors say which form was recognised and what is wrong, never the secret.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from substrateinterface import Keypair, KeypairType

# A derivation junction: "//hard" or "/soft", each with a non-empty name without slashes.
_PATH_RE = re.compile(r"^(//?[^/]+)*$")
_SEED_RE = re.compile(r"^0x[0-9a-fA-F]{64}$")
MAX_KEYSTORE_BYTES = 1024 * 1024


class KeyLoadError(ValueError):
    """The key could not be loaded; the message names the form and the problem, not the secret."""


def load_key(
    key_uri_or_path: str | os.PathLike, password: str | None = None, *, ss58_format: int = 42
) -> Keypair:
    """An sr25519 Keypair from a dev URI, a mnemonic (with path), a 0x seed or a keystore file."""
    if isinstance(key_uri_or_path, os.PathLike):
        return _from_keystore(Path(key_uri_or_path), password, ss58_format)
    if not isinstance(key_uri_or_path, str):
        raise KeyLoadError(f"a key must be given as text or a path, got {type(key_uri_or_path).__name__}")
    text = key_uri_or_path.strip()
    if not text:
        raise KeyLoadError("the key is empty")
    if text.startswith("//"):
        return _from_dev_uri(text, ss58_format)
    # A keystore is a file; a mnemonic has spaces and is never an existing path.
    if " " not in text and (text.endswith(".json") or _is_file(text)):
        return _from_keystore(Path(text), password, ss58_format)
    if text.startswith("/"):
        return _from_dev_uri(text, ss58_format)
    if _SEED_RE.match(text):
        return _from_seed(text, ss58_format)
    if text.startswith("0x"):
        raise KeyLoadError("a hex seed must be 0x followed by exactly 64 hex digits")
    return _from_mnemonic(text, ss58_format)


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False


def _from_dev_uri(uri: str, ss58_format: int) -> Keypair:
    if not _PATH_RE.match(uri):
        raise KeyLoadError(
            "dev key URI must look like //Name or //Name/soft (empty junctions are not allowed)"
        )
    try:
        return Keypair.create_from_uri(uri, ss58_format=ss58_format, crypto_type=KeypairType.SR25519)
    except Exception:
        raise KeyLoadError("dev key URI could not be derived (check the //hard/soft path)") from None


def _from_seed(seed_hex: str, ss58_format: int) -> Keypair:
    try:
        return Keypair.create_from_seed(seed_hex, ss58_format=ss58_format, crypto_type=KeypairType.SR25519)
    except Exception:
        raise KeyLoadError("hex seed could not be turned into an sr25519 key") from None


def _from_mnemonic(text: str, ss58_format: int) -> Keypair:
    slash = text.find("/")
    phrase, path = (text, "") if slash < 0 else (text[:slash], text[slash:])
    phrase = " ".join(phrase.split())
    if "///" in path:
        raise KeyLoadError("passwords inside a key URI (///password) are not supported for sr25519 keys")
    if path and not _PATH_RE.match(path):
        raise KeyLoadError(
            "mnemonic derivation path must look like //hard/soft (empty junctions are not allowed)"
        )
    words = phrase.split(" ")
    if len(words) not in (12, 15, 18, 21, 24):
        raise KeyLoadError(
            f"not a key: expected a dev URI (//Name), a 0x seed, a keystore file or a BIP39 mnemonic "
            f"of 12/15/18/21/24 words, got {len(words)} word(s)"
        )
    try:
        valid = Keypair.validate_mnemonic(phrase)
    except Exception:
        valid = False
    if not valid:
        raise KeyLoadError(
            f"the {len(words)}-word mnemonic is not valid BIP39 (unknown word or bad checksum)"
        )
    try:
        return Keypair.create_from_uri(
            phrase + path, ss58_format=ss58_format, crypto_type=KeypairType.SR25519
        )
    except Exception:
        raise KeyLoadError("the mnemonic could not be derived along its path") from None


def _from_keystore(path: Path, password: str | None, ss58_format: int) -> Keypair:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise KeyLoadError(
            f"keystore {path}: cannot read it ({exc.strerror or type(exc).__name__})"
        ) from None
    if size > MAX_KEYSTORE_BYTES:
        raise KeyLoadError(f"keystore {path}: {size} bytes is too large for a polkadot.js keystore")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KeyLoadError(f"keystore {path}: not a JSON file ({type(exc).__name__})") from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("encoded"), str)
        or not isinstance(data.get("encoding"), dict)
    ):
        raise KeyLoadError(f"keystore {path}: not a polkadot.js keystore (needs 'encoded' and 'encoding')")
    enc = data["encoding"]
    content = enc.get("content")
    if not isinstance(content, list) or "pkcs8" not in content:
        raise KeyLoadError(f"keystore {path}: encoding.content must name pkcs8, got {content!r}")
    if "sr25519" not in content:
        kinds = [c for c in content if c != "pkcs8"]
        raise KeyLoadError(
            f"keystore {path}: holds a {'/'.join(map(str, kinds)) or 'unknown'} key; sr25519 is required"
        )
    types = enc.get("type")
    if not isinstance(types, list) or "xsalsa20-poly1305" not in types:
        raise KeyLoadError(f"keystore {path}: encoding.type must include xsalsa20-poly1305, got {types!r}")
    if "scrypt" in types and password is None:
        raise KeyLoadError(f"keystore {path}: it is encrypted, give its password")
    try:
        return Keypair.create_from_encrypted_json(data, password or "", ss58_format=ss58_format)
    except Exception:
        # Decryption failure and a corrupt body look the same from the outside.
        raise KeyLoadError(f"keystore {path}: wrong password or corrupt keystore") from None


__all__ = ["KeyLoadError", "MAX_KEYSTORE_BYTES", "load_key"]
