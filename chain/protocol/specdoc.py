"""docs/protocol.md is an executable specification: its normative rules are Python blocks that are
exactly the code. Each such block follows a marker naming the object it shows:

    <!-- spec: chain/protocol/rules.py::_commit -->
    ```python
    def _commit(...):
        ...
    ```

`check` lists every difference between the blocks and the code (and the objects of `REQUIRED`
that the document does not show); `write` rewrites the blocks from the code and leaves every other
byte of the document as it was. The code is read as text and located with `ast` (line numbers), not
imported, so neither needs the modules' dependencies.

    python -m chain.protocol.specdoc check [docs/protocol.md]   # exit 1 with the differences
    python -m chain.protocol.specdoc write [docs/protocol.md]   # prints the blocks it rewrote
"""

from __future__ import annotations

import ast
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "protocol.md"

# The objects the document must show, as `path::name` (`name` a top-level function, class or
# assignment, or `Class.method`). Two forms extend a name:
#   `path::*`      every top-level function and class of the file, whatever the version;
#   `path::name+`  the object and every top-level function of its file that it calls by name, and
#                  those they call, transitively (its helpers).
REQUIRED: list[str] = [
    "chain/protocol/rules.py::*",
    "challenges/derive.py::challenge_step_at+",
    "challenges/derive.py::draw_committee+",
    "challenges/derive.py::dispute_seats+",
    "challenges/derive.py::seat_units",
    # the bond a round may seat or an escalation may stake (protocol v3: dispute rounds one at a
    # time, seating every unit; the escalation room that keeps every penalty payable in full)
    "chain/protocol/state.py::free_bond",
    "chain/protocol/state.py::eligible_verifiers",
    "chain/protocol/state.py::dispute_held",
    "chain/protocol/state.py::open_seats",
    "chain/protocol/state.py::dispute_bonds",
    "chain/protocol/state.py::escalation_room",
    "challenges/verdict.py::decide+",
    "chain/protocol/cost.py::replay_cost+",
    "chain/protocol/cost.py::opening_blocks+",
    "chain/protocol/cost.py::run_escrow+",
]

MAX_DOC_BYTES = 4 << 20  # a document or source file larger than this is refused, not parsed
_MARKER = re.compile(r"^<!-- spec: (?P<path>[^\s:]+)::(?P<qualname>[A-Za-z_][\w.]*) -->[ \t]*$")
_MARKER_START = "<!-- spec:"
_OPEN = re.compile(r"^(?P<fence>`{3,})python[ \t]*$")


class SpecDocError(ValueError):
    """A marker or a REQUIRED entry that names no object, or a marker without its block."""


@dataclass(frozen=True)
class Block:
    """One marked block of the document. `line` is the marker's line (from 1); `start` and `end`
    are the character offsets of the block's code in the document (the code is text[start:end]),
    `span` those of the whole fenced block, from its opening fence to the end of its closing one."""

    name: str  # path::qualname, as the marker writes it
    path: str
    qualname: str
    code: str
    line: int
    start: int
    end: int
    fence: str
    span: tuple[int, int]


def _lines(text: str) -> list[str]:
    """The lines of `text`, each with its "\\n" (only "\\n" ends a line, so no byte is lost)."""
    *whole, last = text.split("\n")
    return [line + "\n" for line in whole] + ([last] if last else [])


def _parse(markdown_text: str) -> tuple[list[Block], list[str]]:
    """The marked blocks, and the problems of markers that are not followed by a block."""
    lines = _lines(markdown_text)
    found: list[Block] = []
    problems: list[str] = []
    offset = 0
    offsets = []
    for line in lines:
        offsets.append(offset)
        offset += len(line)
    offsets.append(offset)
    i = 0
    while i < len(lines):
        raw = lines[i].rstrip("\n")
        m = _MARKER.match(raw)
        if m is None:
            if raw.lstrip().startswith(_MARKER_START):
                problems.append(f"line {i + 1}: a spec marker must read `<!-- spec: path::name -->` "
                                f"at the start of its line, got {raw.strip()[:120]!r}")
            i += 1
            continue
        name = f"{m['path']}::{m['qualname']}"
        opening = _OPEN.match(lines[i + 1].rstrip("\n")) if i + 1 < len(lines) else None
        if opening is None:
            problems.append(
                f"line {i + 1}: the marker of {name} is not followed on the next line by a ```python block"
            )
            i += 1
            continue
        fence = opening["fence"]
        j = i + 2
        closing = re.compile("`{" + str(len(fence)) + r",}[ \t]*")
        while j < len(lines) and not closing.fullmatch(lines[j].rstrip("\n")):
            j += 1
        if j >= len(lines):
            problems.append(f"line {i + 1}: the block of {name} is never closed")
            break
        start, end = offsets[i + 2], offsets[j]
        span = (offsets[i + 1], offsets[j] + len(lines[j].rstrip("\n")))
        found.append(
            Block(name, m["path"], m["qualname"], markdown_text[start:end], i + 1, start, end, fence, span)
        )
        i = j + 1
    return found, problems


def blocks(markdown_text: str) -> list[Block]:
    """Every marked block of a markdown text, in document order. A marker without its block is an
    error naming the marker's line."""
    found, problems = _parse(markdown_text)
    if problems:
        raise SpecDocError("; ".join(problems))
    return found


class _Source:
    """One source file, parsed once: where each top-level object and each method lies."""

    def __init__(self, root: Path, path: str) -> None:
        rel = Path(path)
        if rel.is_absolute() or ".." in rel.parts or rel.suffix != ".py":
            raise SpecDocError(f"{path}: a spec path is a .py file relative to the repository root")
        file = root / rel
        if not file.is_file():
            raise SpecDocError(f"{path}: no such file under {root}")
        data = file.read_bytes()
        if len(data) > MAX_DOC_BYTES:
            raise SpecDocError(f"{path} is {len(data)} bytes; at most {MAX_DOC_BYTES} are read")
        self.path = path
        self.text = data.decode("utf-8")
        self.lines = _lines(self.text)
        try:
            self.tree = ast.parse(self.text, filename=path)
        except SyntaxError as exc:
            raise SpecDocError(f"{path} does not parse: {exc}") from None
        self.top: dict[str, ast.stmt] = {}  # the last binding of a name wins, as in Python
        for node in self.tree.body:
            for name in _bound_names(node):
                self.top[name] = node

    def node(self, qualname: str) -> ast.stmt:
        head, _, rest = qualname.partition(".")
        node = self.top.get(head)
        if node is None:
            raise SpecDocError(f"{self.path}::{qualname}: {self.path} has no top-level {head!r}")
        for part in rest.split(".") if rest else ():
            if not isinstance(node, ast.ClassDef):
                raise SpecDocError(f"{self.path}::{qualname}: {head!r} is not a class, it has no {part!r}")
            inner = {n: s for s in node.body for n in _bound_names(s)}
            if part not in inner:
                raise SpecDocError(f"{self.path}::{qualname}: class {node.name!r} has no {part!r}")
            node = inner[part]
        return node

    def code(self, qualname: str) -> tuple[str, int]:
        """The exact source of an object (decorators and docstring kept, a method dedented), and its
        first line in the file."""
        node = self.node(qualname)
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        last = node.end_lineno or node.lineno
        indent = self.lines[first - 1][: node.col_offset]
        out = []
        for line in self.lines[first - 1: last]:
            if line.startswith(indent):
                line = line[len(indent):]
            elif not line.strip():
                line = "\n"
            out.append(line)
        code = "".join(out)
        return (code if code.endswith("\n") else code + "\n"), first

    def definitions(self) -> list[str]:
        """Every top-level function and class, in file order."""
        return [
            n.name
            for n in self.tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ]

    def helpers(self, name: str) -> list[str]:
        """`name` and the top-level functions of this file it calls, transitively, in the order
        first reached (a class it instantiates or raises is not a helper)."""
        defs = {n.name for n in self.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        seen = [name]
        i = 0
        while i < len(seen):
            node = self.node(seen[i])
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name):
                    callee = sub.func.id
                    if callee in defs and callee not in seen:
                        seen.append(callee)
            i += 1
        return seen


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


class _Sources:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.files: dict[str, _Source] = {}

    def __getitem__(self, path: str) -> _Source:
        if path not in self.files:
            self.files[path] = _Source(self.root, path)
        return self.files[path]


def required(root: Path, entries: list[str] | None = None) -> list[str]:
    """The `path::qualname` names that `entries` (REQUIRED by default) stand for, expanded."""
    sources = _Sources(root)
    out: list[str] = []
    for entry in REQUIRED if entries is None else entries:
        path, sep, name = entry.partition("::")
        if not sep or not name:
            raise SpecDocError(f"REQUIRED entry {entry!r} is not `path::name`")
        if name == "*":
            names = sources[path].definitions()
        elif name.endswith("+"):
            names = sources[path].helpers(name[:-1])
        else:
            sources[path].node(name)
            names = [name]
        out += [f"{path}::{n}" for n in names if f"{path}::{n}" not in out]
    return out


def _first_difference(doc: str, code: str) -> tuple[int, str, str]:
    a, b = doc.split("\n"), code.split("\n")
    for k in range(max(len(a), len(b))):
        x = a[k] if k < len(a) else "<end of block>"
        y = b[k] if k < len(b) else "<end of code>"
        if x != y:
            return k + 1, x, y
    return 0, "", ""


def _read(markdown_path: Path) -> str:
    data = Path(markdown_path).read_bytes()
    if len(data) > MAX_DOC_BYTES:
        raise SpecDocError(f"{markdown_path} is {len(data)} bytes; at most {MAX_DOC_BYTES} are read")
    return data.decode("utf-8")


def check(
    markdown_path: Path | str = DOC, root: Path | str = ROOT, required_entries: list[str] | None = None
) -> list[str]:
    """The differences between the document's marked blocks and the code, one message each (the
    block, its line in the document, the first differing line), then every required object that the
    document shows no block of. An empty list: the document is the code."""
    root = Path(root)
    doc_name = str(markdown_path)
    text = _read(Path(markdown_path))
    found, problems = _parse(text)
    out = [f"{doc_name}: {p}" for p in problems]
    sources = _Sources(root)
    for b in found:
        try:
            code, first = sources[b.path].code(b.qualname)
        except SpecDocError as exc:
            out.append(f"{doc_name}:{b.line}: the marker names no object: {exc}")
            continue
        if b.code != code:
            k, x, y = _first_difference(b.code, code)
            out.append(f"{doc_name}:{b.line}: block {b.name} differs from the code at its line {k} "
                       f"(document line {b.line + 1 + k}, {b.path} line {first + k - 1}): "
                       f"the document has {x!r}, the code has {y!r}")
    shown = {b.name for b in found}
    try:
        needed = required(root, required_entries)
    except SpecDocError as exc:
        return [*out, f"REQUIRED names no object: {exc}"]
    out += [
        f"{doc_name}: no block shows {name}, which the specification requires (put its marker and an "
        "empty ```python block beside the prose of its rule, then run `python -m chain.protocol.specdoc "
        "write`)"
        for name in needed
        if name not in shown
    ]
    return out


def write(markdown_path: Path | str = DOC, root: Path | str = ROOT) -> list[str]:
    """Rewrite every marked block of the document from the code, atomically (a temporary file in
    the same folder, then os.replace), leaving every other byte as it was. Returns the names of the
    blocks that changed. A marker that names no object is an error, and nothing is written."""
    path = Path(markdown_path)
    text = _read(path)
    found = blocks(text)
    sources = _Sources(Path(root))
    codes: list[str] = []
    missing: list[str] = []
    for b in found:
        try:
            codes.append(sources[b.path].code(b.qualname)[0])
        except SpecDocError as exc:
            missing.append(f"{path}:{b.line}: the marker names no object: {exc}")
    if missing:
        raise SpecDocError("; ".join(missing))
    pieces: list[str] = []
    changed: list[str] = []
    at = 0
    for b, code in zip(found, codes, strict=True):
        if code == b.code:
            continue
        longest = max((len(m) for m in re.findall(r"^[ \t]*(`{3,})", code, re.M)), default=0)
        if longest >= len(b.fence):  # the code holds a line the fence would end at: a longer fence
            fence = "`" * (longest + 1)
            pieces += [text[at:b.span[0]], f"{fence}python\n", code, fence]
            at = b.span[1]
        else:
            pieces += [text[at:b.start], code]
            at = b.end
        changed.append(b.name)
    if not changed:
        return []
    pieces.append(text[at:])
    new = "".join(pieces)
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(new.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return changed


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m chain.protocol.specdoc check|write [docs/protocol.md]"
    if not args or args[0] not in ("check", "write") or len(args) > 2:
        print(usage, file=sys.stderr)
        return 2
    doc = Path(args[1]) if len(args) == 2 else DOC
    try:
        if args[0] == "check":
            problems = check(doc, ROOT)
            for p in problems:
                print(p)
            if problems:
                print(f"{len(problems)} difference(s) between {doc} and the code; "
                      f"`python -m chain.protocol.specdoc write` rewrites the blocks", file=sys.stderr)
                return 1
            print(f"{doc}: every block is the code")
            return 0
        rewritten = write(doc, ROOT)
    except (SpecDocError, OSError, UnicodeDecodeError) as exc:
        print(f"specdoc: {exc}", file=sys.stderr)
        return 1
    for name in rewritten:
        print(f"rewrote {name}")
    if not rewritten:
        print(f"{doc}: every block was the code already")
    return 0


if __name__ == "__main__":
    sys.exit(main())
