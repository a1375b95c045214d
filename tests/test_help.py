"""Every `--help` page of the `pot` command renders the text its source gives, bracketed names included.

A help renderer that reads `[init]` or `[protocol]` as markup drops them silently ("the parameters
file the spec's  commits to"); these tests render each page of the command tree and compare it with
the command's docstring and every option's help string.
"""

from __future__ import annotations

import importlib
import re
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from pot.cli import SUBAPPS, app

# Wide enough that no help line wraps, so a source paragraph renders as one run of text.
WIDE = 100_000


def _tree() -> list[tuple[tuple[str, ...], Any]]:
    """(path, command) for the root, every group and every subcommand, depth first."""
    found: list[tuple[tuple[str, ...], Any]] = []

    def walk(path: tuple[str, ...], cmd: Any) -> None:
        found.append((path, cmd))
        if hasattr(cmd, "commands"):  # a group
            for name in sorted(cmd.commands):
                walk((*path, name), cmd.commands[name])

    walk((), typer.main.get_command(app))
    return found


TREE = _tree()


def _render(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], prog_name="pot",
                                terminal_width=WIDE, max_content_width=WIDE)
    assert result.exit_code == 0, f"pot {' '.join(path)} --help: exit {result.exit_code}\n{result.output}"
    return result.output


def _sources(cmd: Any) -> list[tuple[str, str]]:
    """(what, text) of every help string the page shows: the command's and each visible parameter's."""
    out = []
    if cmd.help:
        out.append(("the command's help", cmd.help.partition("\f")[0]))
    for param in cmd.params:
        text = getattr(param, "help", None)
        if text and not getattr(param, "hidden", False):
            out.append((f"the help of {param.opts[0] if param.opts else param.name}", text))
    return out


def _paragraphs(text: str) -> list[str]:
    """The source's paragraphs, each as the one line a renderer that does not wrap prints."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]


def _help_texts(page: str) -> list[str]:
    """The page's prose: its text before the first section, and the help column of each section's rows.

    A row (two spaces, then an option, argument or command name) keeps its name apart from its help
    by a gap of two or more spaces; a line indented deeper continues a help text.
    """
    texts, in_section = [], False
    for line in page.splitlines():
        if re.match(r"^\S.*:$", line):  # "Options:", "Commands:", ...
            in_section = True
            continue
        if in_section and re.match(r"^  \S", line):
            parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            texts.append(parts[1] if len(parts) == 2 else "")
        else:
            texts.append(line.strip())
    return [t for t in texts if t]


def _problems(path: tuple[str, ...], cmd: Any, page: str) -> list[str]:
    lines = [" ".join(line.split()) for line in page.splitlines()]
    sources = _sources(cmd)
    source_text = " ".join(text for _, text in sources)
    problems = []
    for what, text in sources:
        for para in _paragraphs(text):
            if not any(para in line for line in lines):
                problems.append(f"{what} is not on the page as written: {para!r}")
    for empty in ("()", "[]"):
        if empty in page and empty not in source_text:
            problems.append(f"an empty {empty} where a name was")
    for text in _help_texts(page):
        if re.search(r"[a-z,;']  [a-z]", text):
            problems.append(f"a double space where a word was: {text!r}")
    return [f"pot {' '.join(path)} --help: {p}" for p in problems]


def test_the_tree_holds_every_noun_and_its_commands():
    paths = {path for path, _ in TREE}
    assert {(noun,) for noun, *_ in SUBAPPS} <= paths
    assert ("miner", "train") in paths and ("spec", "digest") in paths and ("oracle", "walk") in paths
    assert len(paths) >= 30


@pytest.mark.parametrize(("path", "cmd"), TREE, ids=[" ".join(path) or "pot" for path, _ in TREE])
def test_every_help_page_renders_its_source_text(path, cmd):
    page = _render(path)
    assert _problems(path, cmd, page) == []


def test_the_check_catches_a_dropped_bracketed_name():
    """A page whose renderer dropped "[init]" from the source is reported, by all three checks."""
    cmd = SimpleNamespace(help="Read the file the spec's [init] commits to (its ()).",
                          params=[SimpleNamespace(opts=["--init"], name="init", help="the spec's [init]")])
    page = "Usage: x\n\n  Read the file the spec's  commits to (its ).\n\n  --init TEXT  the spec's\n"
    problems = _problems(("x",), cmd, page)
    assert any("not on the page as written" in p and "[init]" in p for p in problems)
    assert any("double space" in p for p in problems)
    assert (
        _problems(
            ("x",),
            cmd,
            page.replace("spec's  commits to (its )", "spec's [init] commits to (its ())").replace(
                "the spec's\n", "the spec's [init]\n"
            ),
        )
        == []
    )


@pytest.mark.parametrize(("noun", "module", "attr"), [(n, m, a) for n, m, a, _ in SUBAPPS])
def test_each_sub_app_renders_plain_text_on_its_own(noun, module, attr):
    """Run as its own app (as tests and scripts do), a sub-app does not read brackets as markup either."""
    sub = getattr(importlib.import_module(module), attr)
    assert sub.rich_markup_mode is None, f"{module}.{attr} ({noun}) reads its help text as markup"
    assert app.rich_markup_mode is None


NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def test_the_demo_help_counts_the_demo_verifiers():
    """`pot demo --help` and `pot --help` say as many verifiers as the demo starts, with its faults."""
    from devnet.demo import VERIFIERS

    count = NUMBERS[len(VERIFIERS)]
    honest = NUMBERS.get(sum(f == "none" for _, f in VERIFIERS), "one")
    for path in ((), ("demo",)):
        page = " ".join(_render(path).split())
        said = re.findall(r"(\w+) verifier(?:s| nodes)", page)
        assert said and set(said) == {count}, (path, said)
        assert f"({honest} honest, one revealing noise, one lazy)" in page
    assert [f for _, f in VERIFIERS].count("noise") == 1 and [f for _, f in VERIFIERS].count("lazy") == 1
