"""Key loading: dev URIs, mnemonics with paths, hex seeds and polkadot.js keystores, and refusals."""

from __future__ import annotations

import json

import pytest
from substrateinterface import Keypair

from chain.keys import KeyLoadError, load_key

# Well-known public test vectors: //Alice and the dev phrase it derives from.
ALICE = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"
DEV_PHRASE = "bottom drive obey lake curtain smoke basket hold race lonely fit walk"
MNEMONIC = Keypair.generate_mnemonic(12)


def test_dev_uri_is_alice():
    kp = load_key("//Alice")
    assert kp.ss58_address == ALICE
    assert kp.crypto_type == 1  # sr25519


def test_dev_uri_with_soft_and_hard_path_differs():
    a, b = load_key("//Alice/stash"), load_key("//Alice//stash")
    assert len({a.public_key, b.public_key, load_key("//Alice").public_key}) == 3


def test_dev_phrase_with_path_equals_dev_uri():
    assert load_key(DEV_PHRASE + "//Alice").public_key == load_key("//Alice").public_key


def test_mnemonic_plain_and_with_path():
    plain = load_key(MNEMONIC)
    assert plain.public_key == Keypair.create_from_mnemonic(MNEMONIC).public_key
    derived = load_key(MNEMONIC + "//pot//0")
    assert derived.public_key != plain.public_key
    assert derived.public_key == load_key(f"  {MNEMONIC}//pot//0 ").public_key


def test_ss58_format_is_applied():
    assert load_key("//Alice", ss58_format=2).ss58_address != ALICE
    assert load_key("//Alice", ss58_format=2).public_key == load_key("//Alice").public_key


def test_hex_seed():
    seed = "0x" + "11" * 32
    assert load_key(seed).public_key == Keypair.create_from_seed(seed).public_key


def test_keystore_roundtrip_with_password(tmp_path):
    kp = Keypair.create_from_mnemonic(MNEMONIC)
    path = tmp_path / "miner.json"
    path.write_text(json.dumps(kp.export_to_encrypted_json("correct horse", name="miner")))
    for arg in (path, str(path)):
        got = load_key(arg, password="correct horse")
        assert got.public_key == kp.public_key
        msg = b"sign me"
        assert kp.verify(msg, got.sign(msg))


def test_keystore_wrong_or_missing_password(tmp_path):
    kp = Keypair.create_from_uri("//Bob")
    path = tmp_path / "bob.json"
    path.write_text(json.dumps(kp.export_to_encrypted_json("right-pass")))
    with pytest.raises(KeyLoadError, match="wrong password") as exc:
        load_key(path, password="wrong-pass")
    assert "wrong-pass" not in str(exc.value) and "right-pass" not in str(exc.value)
    with pytest.raises(KeyLoadError, match="give its password"):
        load_key(path)


@pytest.mark.parametrize(
    "body, reason",
    [
        ("not json", "not a JSON file"),
        ("[1, 2]", "not a polkadot.js keystore"),
        (
            json.dumps(
                {
                    "encoded": "00",
                    "encoding": {"content": ["pkcs8", "ed25519"], "type": ["scrypt", "xsalsa20-poly1305"]},
                }
            ),
            "sr25519 is required",
        ),
        (
            json.dumps({"encoded": "00", "encoding": {"content": ["pkcs8", "sr25519"], "type": ["none"]}}),
            "xsalsa20-poly1305",
        ),
        (
            json.dumps(
                {
                    "encoded": "00",
                    "encoding": {"content": ["pkcs8", "sr25519"], "type": ["scrypt", "xsalsa20-poly1305"]},
                }
            ),
            "wrong password or corrupt",
        ),
    ],
)
def test_bad_keystores(tmp_path, body, reason):
    path = tmp_path / "k.json"
    path.write_text(body)
    with pytest.raises(KeyLoadError, match=reason):
        load_key(path, password="pw")


def test_missing_keystore_file(tmp_path):
    with pytest.raises(KeyLoadError, match="cannot read it"):
        load_key(str(tmp_path / "absent.json"), password="pw")


def test_bad_mnemonic_does_not_echo_words():
    words = DEV_PHRASE.split()
    words[-1] = "zebra"  # valid word, wrong checksum
    bad = " ".join(words)
    with pytest.raises(KeyLoadError, match="not valid BIP39") as exc:
        load_key(bad)
    assert "zebra" not in str(exc.value) and "bottom" not in str(exc.value)


@pytest.mark.parametrize(
    "key, reason",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("hunter2", "got 1 word"),
        ("0x1234", "exactly 64 hex"),
        ("///", "//Name"),
        ("//Alice//", "//Name"),
        (DEV_PHRASE + "///secret", "not supported"),
        (DEV_PHRASE + "//a///b", "not supported"),
    ],
)
def test_refusals_are_clear_and_quiet(key, reason):
    with pytest.raises(KeyLoadError, match=reason) as exc:
        load_key(key)
    assert "hunter2" not in str(exc.value) and "secret" not in str(exc.value)


def test_non_text_key():
    with pytest.raises(KeyLoadError, match="text or a path"):
        load_key(1234)  # type: ignore[arg-type]
