"""docs/protocol.md is enough to implement the protocol: its checklist ("What an implementation must
reproduce") names, for every item, a section of the document and a test file that exist; and the
facts it states about the dev chain's hashes, the near misses of the prefix, and bonds on Substrate
(the bond account, planck_per_unit, the funding rule) are the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chain.calls import near_miss
from chain.dev import genesis_hash
from chain.substrate.bonds import BOND_ACCOUNT, PLANCK_PER_UNIT, bond_address, funding_shortfall

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "protocol.md").read_text()


def _anchor(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's rule) gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return "#" + text.replace(" ", "-")


def _anchors() -> set[str]:
    return {_anchor(m.group(1)) for m in re.finditer(r"^#{2,4} (.+)$", DOC, re.M)}


def _checklist() -> list[tuple[str, str, str]]:
    section = DOC[DOC.index("## 15. What an implementation must reproduce"):]
    rows = re.findall(r"^\| (.+?) \| \[§[0-9.]+\]\((#[^)]+)\) \| `([^`]+)` \|$", section, re.M)
    body = [
        line
        for line in section.splitlines()
        if line.startswith("| ") and not line.startswith(("| item", "| ---"))
    ]
    assert len(rows) == len(body), "a checklist row is not `| item | [§N](#anchor) | `tests/...py` |`"
    return rows


def test_the_anchor_rule_matches_the_document_s_own_contents_links():
    contents = re.findall(r"\]\((#[^)]+)\)", DOC[:DOC.index("## 1. Conventions")])
    assert contents and set(contents) <= _anchors(), set(contents) - _anchors()


def test_every_checklist_item_names_a_section_and_a_test_file_that_exist():
    rows = _checklist()
    assert len(rows) >= 30
    anchors = _anchors()
    for item, anchor, test in rows:
        assert anchor in anchors, f"checklist item {item!r} names no section: {anchor}"
        assert test.startswith("tests/") and test.endswith(".py") and (ROOT / test).is_file(), \
            f"checklist item {item!r} names a test file that does not exist: {test}"
    # The derivations, draws and state-machine steps each have their row.
    named = {a for _, a, _ in rows}
    for number in ("1", "11", "21", "22", "23", "24", "26", "261", "31", "32", "33", "34", "341", "35", "36",
                   "37", "38", "39", "310", "311", "41", "42", "43", "44", "45", "46", "5"):
        assert any(a.startswith(f"#{number}-") for a in named), f"no checklist item for section {number}"


def test_the_dev_chain_genesis_hash_is_the_documented_one():
    assert f'`digest("pot/dev/genesis/v1")` = `{genesis_hash().hex()}`' in DOC


def test_the_bond_account_and_its_addresses_are_the_documented_ones():
    assert BOND_ACCOUNT == b"modl" + b"pot/bond" + bytes(20)
    assert f"`{BOND_ACCOUNT.hex()}`" in DOC
    for prefix in (42, 2, 0):
        assert f"`{bond_address(prefix)}` under {prefix}" in DOC, prefix


def test_planck_per_unit_is_the_documented_value():
    assert PLANCK_PER_UNIT == 10**10
    assert "It is a protocol parameter (§11, default **10^10**)" in DOC


def test_several_bonds_of_one_extrinsic_need_their_sum_all_or_none():
    signer, other = bytes(range(32)), bytes(32)
    paid = [(signer, BOND_ACCOUNT, 5 * PLANCK_PER_UNIT)]
    assert funding_shortfall(signer, paid, [2, 3], planck_per_unit=PLANCK_PER_UNIT) is None
    assert funding_shortfall(signer, paid, [2, 4], planck_per_unit=PLANCK_PER_UNIT).startswith(
        "amount short:"
    )
    assert funding_shortfall(signer, [(signer, other, 10**12)], [1],
                             planck_per_unit=PLANCK_PER_UNIT).startswith("wrong destination:")
    assert funding_shortfall(signer, [(other, BOND_ACCOUNT, 10**12)], [1],
                             planck_per_unit=PLANCK_PER_UNIT).startswith("no transfer:")
    assert "none is (**all or none**, whatever" in DOC


@pytest.mark.parametrize(("payload", "reason"), [
    (b"p", "truncated"), (b"po", "truncated"), (b"pot", "truncated"),
    (b"", None), (b"pt", None), (b"ot1", None), (b"ot1x", "bad_prefix"),
    (b"0x706F7431aa", "bad_prefix"), (b"0X706f7431", "bad_prefix"), (b"0x706f743", None),
    (b"POT1\x82", "bad_prefix"), (b"Pot1", "bad_prefix"), (b"pot2", None), (b"hello", None),
])
def test_the_near_misses_are_exactly_the_documented_ones(payload, reason):
    got = near_miss(payload)
    assert (None if got is None else got.reason) == reason
    assert "exactly `70`, `706f` or `706f74`" in DOC
