"""docs/protocol.md is an executable specification: its marked Python blocks are exactly the code
they name (chain/protocol/specdoc.py), and the document shows every object the specification
requires. Any difference fails here; `python -m chain.protocol.specdoc write` regenerates the blocks."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from chain.protocol import specdoc
from chain.protocol.specdoc import REQUIRED, SpecDocError, blocks, check, required, write

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"


def _copy(tmp_path: Path, text: str | None = None) -> Path:
    out = tmp_path / "protocol.md"
    out.write_bytes(DOC.read_bytes() if text is None else text.encode("utf-8"))
    return out


def _block(text: str, name: str) -> specdoc.Block:
    found = [b for b in blocks(text) if b.name == name]
    assert found, f"docs/protocol.md has no block {name}"
    return found[0]


def _outside_blocks(text: str) -> list[str]:
    """The document's text between its blocks' code, in order."""
    pieces, at = [], 0
    for b in blocks(text):
        pieces.append(text[at:b.start])
        at = b.end
    return [*pieces, text[at:]]


def test_the_document_is_the_code():
    problems = check(DOC, ROOT)
    assert problems == [], "\n".join(problems)


def test_the_document_shows_every_required_object():
    shown = {b.name for b in blocks(DOC.read_text(encoding="utf-8"))}
    needed = required(ROOT)
    assert set(needed) <= shown, sorted(set(needed) - shown)
    # Every top-level function and class of the rules, whatever the version of the file.
    tree = ast.parse((ROOT / "chain/protocol/rules.py").read_text(encoding="utf-8"))
    defs = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assert defs and {f"chain/protocol/rules.py::{d}" for d in defs} <= set(needed)
    # The draws with the helpers they call, the verdict and the replay cost.
    for name in ("challenge_step_at", "_draw", "_check", "_check_hashes", "draw_committee", "_uniform",
                 "dispute_seats"):
        assert f"challenges/derive.py::{name}" in needed, name
    assert "challenges/verdict.py::decide" in needed and "chain/protocol/cost.py::replay_cost" in needed


def test_one_changed_character_inside_a_block_fails_naming_the_block(tmp_path):
    text = DOC.read_text(encoding="utf-8")
    b = _block(text, "chain/protocol/rules.py::_commit")
    at = b.code.index("NotInCommittee") + 3  # a character on the block's k-th line
    k = b.code[:at].count("\n") + 1
    mutated = text[:b.start + at] + "X" + text[b.start + at + 1:]
    problems = check(_copy(tmp_path, mutated), ROOT)
    assert len(problems) == 1, problems
    msg = problems[0]
    assert "chain/protocol/rules.py::_commit" in msg
    assert f":{b.line}: " in msg and f"at its line {k} " in msg and f"document line {b.line + 1 + k}" in msg
    assert "NotXnCommittee" in msg and "NotInCommittee" in msg  # the first differing line, both ways


def test_a_missing_required_object_is_reported(tmp_path):
    text = DOC.read_text(encoding="utf-8")
    b = _block(text, "chain/protocol/rules.py::_seats")
    marker = text.rindex("<!-- spec:", 0, b.start)
    without = text[:marker] + text[b.span[1] + 1:]
    problems = check(_copy(tmp_path, without), ROOT)
    assert len(problems) == 1 and problems[0].startswith(
        f"{tmp_path / 'protocol.md'}: no block shows chain/protocol/rules.py::_seats, which the "
        "specification requires"
    )
    # A REQUIRED entry naming nothing is reported too, naming it.
    problems = check(DOC, ROOT, [*REQUIRED, "chain/protocol/rules.py::_no_such_rule"])
    assert len(problems) == 1 and "_no_such_rule" in problems[0], problems


def test_write_refreshes_a_stale_copy_and_leaves_the_rest_byte_equal(tmp_path):
    text = DOC.read_text(encoding="utf-8")
    stale = text
    for name in ("chain/protocol/rules.py::on_block", "challenges/derive.py::draw_committee",
                 "chain/protocol/params.py::MAX_COMMITTEE"):
        b = _block(stale, name)
        stale = stale[:b.start] + "def old():\n    pass\n" + stale[b.end:]
    path = _copy(tmp_path, stale)
    path.chmod(0o644)
    assert len(check(path, ROOT)) == 3
    assert write(path, ROOT) == ["challenges/derive.py::draw_committee", "chain/protocol/rules.py::on_block",
                                 "chain/protocol/params.py::MAX_COMMITTEE"]  # in document order
    assert check(path, ROOT) == []
    assert path.read_bytes() == DOC.read_bytes()
    assert _outside_blocks(path.read_text(encoding="utf-8")) == _outside_blocks(stale)
    assert path.stat().st_mode & 0o777 == 0o644  # the atomic replace keeps the file's mode
    assert write(path, ROOT) == []  # nothing to rewrite: the file is not touched
    assert not [p for p in tmp_path.iterdir() if p.name != "protocol.md"]  # no temporary file is left


def test_write_reports_the_blocks_it_rewrote_in_document_order(tmp_path):
    text = DOC.read_text(encoding="utf-8")
    names = [b.name for b in blocks(text)]
    first, last = names[0], names[-1]
    stale = text
    for name in (last, first):  # the later one first, so the earlier offsets hold
        b = _block(stale, name)
        stale = stale[:b.start] + "# stale\n" + stale[b.end:]
    path = _copy(tmp_path, stale)
    assert write(path, ROOT) == [first, last]
    assert path.read_bytes() == DOC.read_bytes()


def test_a_marker_naming_no_object_is_an_error_naming_it(tmp_path):
    text = DOC.read_text(encoding="utf-8")
    b = _block(text, "chain/protocol/rules.py::_commit")
    wrong = text.replace("<!-- spec: chain/protocol/rules.py::_commit -->",
                         "<!-- spec: chain/protocol/rules.py::_comit -->", 1)
    path = _copy(tmp_path, wrong)
    problems = check(path, ROOT)
    assert any(f":{b.line}: the marker names no object" in p and "_comit" in p for p in problems), problems
    with pytest.raises(SpecDocError, match="_comit"):
        write(path, ROOT)
    assert path.read_text(encoding="utf-8") == wrong  # nothing written
    for bad, why in (("chain/protocol/rules.py::_Savepoint.nope", "has no 'nope'"),
                     ("chain/protocol/rules.py::_seats.x", "is not a class"),
                     ("chain/protocol/nowhere.py::f", "no such file"),
                     ("../rules.py::f", "relative to the repository root")):
        path.write_text(f"<!-- spec: {bad} -->\n```python\n```\n", encoding="utf-8")
        with pytest.raises(SpecDocError, match=why):
            write(path, ROOT)


def test_a_marker_without_its_block_is_an_error(tmp_path):
    with pytest.raises(SpecDocError, match="line 1: the marker of a.py::f is not followed"):
        blocks("<!-- spec: a.py::f -->\n\n```python\n```\n")
    with pytest.raises(SpecDocError, match="never closed"):
        blocks("<!-- spec: a.py::f -->\n```python\ndef f(): ...\n")
    with pytest.raises(SpecDocError, match="must read"):
        blocks("  <!-- spec: a.py::f -->\n```python\n```\n")


def test_extraction_keeps_decorators_docstrings_and_dedents_methods(tmp_path):
    src = tmp_path / "pkg" / "mod.py"
    src.parent.mkdir()
    src.write_text(
        'import functools\n\nLIMIT = 3  # a cap\n\n\n'
        '@functools.lru_cache(maxsize=None)\ndef f(x):\n    """Doc.\n\n    ```\n    fenced\n    ```\n    '
        '"""\n'
        '    return x\n\n\nclass K:\n    """A class."""\n\n    @staticmethod\n    def m(y):\n        s = '
        '"""\nflush\n"""\n'
        '\n        return y + s\n',
        encoding="utf-8",
    )
    doc = tmp_path / "doc.md"
    names = ("f", "K.m", "LIMIT", "K")
    original = "# Doc\n\n" + "".join(
        f"text {n}\n<!-- spec: pkg/mod.py::{n} -->\n```python\n```\nafter\n" for n in names
    )
    doc.write_text(original, encoding="utf-8")
    assert len(check(doc, tmp_path, [])) == 4
    assert write(doc, tmp_path) == ["pkg/mod.py::f", "pkg/mod.py::K.m", "pkg/mod.py::LIMIT", "pkg/mod.py::K"]
    assert check(doc, tmp_path, ["pkg/mod.py::*"]) == []
    got = {b.qualname: b for b in blocks(doc.read_text(encoding="utf-8"))}
    assert got["f"].code.startswith("@functools.lru_cache(maxsize=None)\ndef f(x):\n    \"\"\"Doc.")
    assert got["f"].fence == "````"  # the docstring's own fence would end a ``` block
    assert got["K.m"].code == '@staticmethod\ndef m(y):\n    s = """\nflush\n"""\n\n    return y + s\n'
    assert got["LIMIT"].code == "LIMIT = 3  # a cap\n"
    assert got["K"].code.startswith('class K:\n    """A class."""\n')
    # Only the blocks changed: every line outside them is the original's.
    after = doc.read_text(encoding="utf-8")
    assert [ln for ln in after.splitlines() if ln.startswith(("text ", "after", "<!--", "# "))] == \
           [ln for ln in original.splitlines() if ln.startswith(("text ", "after", "<!--", "# "))]
    assert write(doc, tmp_path) == []


def test_the_command_line_checks_and_writes(tmp_path, capsys):
    text = DOC.read_text(encoding="utf-8")
    b = _block(text, "chain/protocol/rules.py::_bond")
    path = _copy(tmp_path, text[:b.start] + "pass\n" + text[b.end:])
    assert specdoc.main(["check", str(path)]) == 1
    out = capsys.readouterr()
    assert "chain/protocol/rules.py::_bond" in out.out and "1 difference(s)" in out.err
    assert specdoc.main(["write", str(path)]) == 0
    assert capsys.readouterr().out == "rewrote chain/protocol/rules.py::_bond\n"
    assert specdoc.main(["check", str(path)]) == 0
    assert specdoc.main(["lint"]) == 2
    run = subprocess.run([sys.executable, "-m", "chain.protocol.specdoc", "check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
