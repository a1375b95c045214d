"""Hostile config files: every unreadable byte sequence, nesting or value is a ConfigError naming the
file (or variable) and what is wrong, never a raw decoder exception."""

from __future__ import annotations

import pytest

from node.config import ConfigError, load_config, load_secrets


def _write(tmp_path, name: str, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_invalid_utf8_names_the_file_and_the_byte(tmp_path):
    p = _write(tmp_path, "node.toml", b'[node]\ndata_dir = "\xff\xfe"\n')
    with pytest.raises(ConfigError, match=r"node\.toml is not UTF-8 text: byte 0xff at offset 19") as err:
        load_config(p, env={})
    assert str(p) in str(err.value)


def test_deeply_nested_arrays_are_a_config_error(tmp_path):
    p = _write(tmp_path, "node.toml", b"x = " + b"[" * 100_000 + b"]" * 100_000 + b"\n")
    with pytest.raises(ConfigError, match="nests arrays or inline tables too deeply") as err:
        load_config(p, env={})
    assert str(p) in str(err.value)


def test_an_integer_too_long_to_convert_is_a_config_error(tmp_path):
    p = _write(tmp_path, "node.toml", b"[replay]\nworkers = 1" + b"0" * 5000 + b"\n")
    with pytest.raises(ConfigError, match=r"node\.toml holds a value that cannot be read"):
        load_config(p, env={})


@pytest.mark.parametrize(
    "key,section",
    [("data_dir", "node"), ("openings_dir", "node"), ("secrets_file", "node"), ("admin_token_file", "http")],
)
def test_a_nul_byte_in_a_path_names_the_key(tmp_path, key, section):
    p = _write(tmp_path, "node.toml", f'[{section}]\n{key} = "a\\u0000b"\n'.encode())
    with pytest.raises(ConfigError, match=rf"{section}\.{key}: a path cannot contain a NUL byte"):
        load_config(p, env={})


def test_a_nul_byte_in_the_config_path_itself(tmp_path):
    with pytest.raises(ConfigError, match="contains a NUL byte"):
        load_config(str(tmp_path / "a\0b.toml"), env={})


def test_a_bad_integer_list_in_the_environment_names_the_variable():
    with pytest.raises(
        ConfigError, match=r"POT_PROTOCOL_FORCED_CHALLENGE_STEPS: 'a,b' is not a list of integers"
    ):
        load_config(None, env={"POT_PROTOCOL_FORCED_CHALLENGE_STEPS": "a,b"})


def test_the_secrets_file_gets_the_same_errors(tmp_path):
    p = _write(tmp_path, "secrets.toml", b'[key]\nuri = "\xc3"\n')
    p.chmod(0o600)
    with pytest.raises(ConfigError, match=r"secrets file .*secrets\.toml is not UTF-8 text"):
        load_secrets(p, env={})
