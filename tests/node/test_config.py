"""Node configuration: the documented example is complete, env overrides apply, errors name the key."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from node.config import (
    ConfigError,
    NodeConfig,
    check_signer,
    load_config,
    load_secrets,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node.toml"


def test_example_documents_every_key_with_its_default_and_env_var():
    cfg = load_config(EXAMPLE, env={})
    defaults = NodeConfig()
    text = EXAMPLE.read_text()
    for section, field in NodeConfig.model_fields.items():
        model = field.annotation
        for key in model.model_fields:
            assert re.search(rf"^{key} = ", text, re.M), f"[{section}] {key} is not in examples/node.toml"
            assert f"POT_{section.upper()}_{key.upper()}" in text, f"env var of {section}.{key} undocumented"
            if not (section == "node" and key == "data_dir"):
                assert getattr(getattr(cfg, section), key) == getattr(getattr(defaults, section), key)


def test_env_overrides_win(tmp_path):
    p = tmp_path / "node.toml"
    p.write_text('[chain]\nurl = "dev:///a.db"\naccount = "v1"\n[replay]\nworkers = 2\n')
    cfg = load_config(p, env={"POT_CHAIN_URL": "dev:///b.db", "POT_REPLAY_WORKERS": "3",
                              "POT_PROTOCOL_FORCED_CHALLENGE_STEPS": "7, 9"})
    assert cfg.chain.url == "dev:///b.db" and cfg.chain.account == "v1"
    assert cfg.replay.workers == 3
    assert cfg.protocol.params().forced_challenge_steps == (7, 9)
    from fractions import Fraction

    assert load_config(p, env={"POT_PROTOCOL_QUORUM_SHARE": "2/3"}).protocol.params().quorum_share == Fraction(2, 3)
    assert cfg.data_dir == tmp_path / "pot-node-data"
    assert cfg.database_url == f"sqlite:///{tmp_path / 'pot-node-data' / 'node.db'}"


@pytest.mark.parametrize("toml, needle", [
    ('[chain]\nurl = "http://x"\n', "chain.url: must be dev:///"),
    ('[replay]\nworkers = 0\n', "replay.workers"),
    ('[node]\nfault = "lazy"\n', "fault is not a node setting: test faults are injected by a test network's harness"),
    ('[node]\nfault_kill_at = "fetched"\n', "fault_kill_at is not a node setting"),
    ('[chain]\nurll = "dev:///x"\n', "chain.urll: unknown key"),
    ('[protocol]\ncommit_window = 0\n', "commit_window must be a positive integer"),
    ('[http]\nlisten = "8700"\n', "http.listen: must be host:port"),
    ('[protocol]\nquorum_share = [1, 2, 3]\n', "quorum_share must be [numerator, denominator]"),
    ('[database]\nurl = "mysql://x"\n', "database.url"),
    ("[chain\n", "not valid TOML"),
])
def test_bad_config_names_the_key(tmp_path, toml, needle):
    p = tmp_path / "node.toml"
    p.write_text(toml)
    with pytest.raises(ConfigError) as exc:
        load_config(p, env={})
    assert needle in str(exc.value)


def test_postgres_url_without_its_driver_names_the_extra(tmp_path, monkeypatch):
    p = tmp_path / "node.toml"
    p.write_text('[database]\nurl = "postgresql+psycopg2://pot@127.0.0.1:5432/potnode"\n')
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # what `import psycopg2` meets without the extra
    with pytest.raises(ConfigError) as exc:
        load_config(p, env={})
    assert "database.url" in str(exc.value) and "pot-verifier[postgres]" in str(exc.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", env={})


def test_secrets_file_and_env(tmp_path):
    p = tmp_path / "secrets.toml"
    p.write_text('[key]\nuri = "//Bob"\n')
    p.chmod(0o600)
    s = load_secrets(p, env={})
    assert s.key == "//Bob" and "//Bob" not in repr(s)
    assert load_secrets(None, env={"POT_KEY_URI": "//Carol"}).key == "//Carol"
    p.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_secrets(p, env={})


def test_secrets_refuse_two_keys(tmp_path):
    p = tmp_path / "secrets.toml"
    p.write_text('[key]\nuri = "//Bob"\nmnemonic = "a b c"\n')
    os.chmod(p, 0o600)
    with pytest.raises(ConfigError, match="exactly one of uri, mnemonic, keystore"):
        load_secrets(p, env={})


def test_signer_needed_per_chain_kind(tmp_path):
    dev = load_config(None, env={"POT_CHAIN_URL": "dev:///c.db"})
    with pytest.raises(ConfigError, match="chain.account"):
        check_signer(dev, load_secrets(None, env={}))
    ws = load_config(None, env={"POT_CHAIN_URL": "ws://127.0.0.1:9944"})
    with pytest.raises(ConfigError, match="signing key"):
        check_signer(ws, load_secrets(None, env={}))
    check_signer(ws, load_secrets(None, env={"POT_KEY_URI": "//Alice"}))


def test_the_verifier_bond(tmp_path):
    from chain.protocol import ProtocolParams

    p = tmp_path / "node.toml"
    p.write_text('[verifier]\nbond = 250\n')
    cfg = load_config(p, env={})
    assert cfg.verifier.bond == 250
    assert cfg.verifier.target(ProtocolParams(verifier_stake=100)) == 250
    auto = load_config(None, env={})
    assert auto.verifier.bond == "auto" and auto.verifier.target(ProtocolParams(verifier_stake=120)) == 120
    assert load_config(p, env={"POT_VERIFIER_BOND": "0"}).verifier.target(ProtocolParams()) == 0
    assert load_config(p, env={"POT_VERIFIER_BOND": "auto"}).verifier.bond == "auto"
    p.write_text("[verifier]\nbond = -5\n")
    with pytest.raises(ConfigError, match="verifier.bond"):
        load_config(p, env={})


def test_the_protocol_pin_names_every_v2_parameter():
    from dataclasses import fields

    from chain.protocol import ProtocolParams
    from node.config import ProtocolSection

    assert set(ProtocolSection.model_fields) == {f.name for f in fields(ProtocolParams)}
    assert ProtocolSection().params() == ProtocolParams()
    assert ProtocolSection(committee_size=7, max_rounds=4).params().committee_size == 7
