"""The audit of stock torch operations on exact-v1 paths: the source of every exact-path module is
read (an AST walk) and any torch function, torch attribute or tensor method that is not on the
allow list (oracle.exact.allowed_ops) is refused; docs/exact-v1.md §11 lists the same names."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import torch

from oracle.exact import allowed_ops as A

ROOT = Path(__file__).resolve().parents[2]
# Calls whose method name is also a tensor method but whose receiver is not a tensor.
NOT_TENSOR_CALLS = {("oracle/exact/accumulate.py", "self._sites.values"),
                    ("oracle/profiles.py", "self._base.matmul")}  # MixedOps: the base op namespace


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _module_names(tree: ast.Module) -> set[str]:
    """Names a file binds to modules (import x, import x as y, from p import module)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                try:
                    importlib.import_module(f"{node.module}.{a.name}")
                except ImportError:
                    continue
                out.add(a.asname or a.name)
    return out


def scan(path: Path, rel: str | None = None):
    """(torch names referenced, tensor-method calls, problems) of one source file."""
    rel = rel or path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(), filename=rel)
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    modules = _module_names(tree)
    torch_names, methods, problems = set(), set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            problems.append(
                f"{rel}:{node.lineno}: 'from {node.module} import ...' hides torch ops from the audit"
            )
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("torch") and a.name != "torch" or (a.name == "torch" and a.asname):
                    problems.append(f"{rel}:{node.lineno}: 'import {a.name}' aliases torch")
        if isinstance(node, ast.Attribute) and not isinstance(parents.get(node), ast.Attribute):
            d = _dotted(node)
            if d and d.split(".")[0] == "torch":
                torch_names.add((d, node.lineno))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            recv = _dotted(node.func.value)
            root = recv.split(".")[0] if recv else None
            if root == "torch" or root in modules or (rel, f"{recv}.{node.func.attr}") in NOT_TENSOR_CALLS:
                continue
            if hasattr(torch.Tensor, node.func.attr):
                methods.add((node.func.attr, node.lineno))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            problems.append(f"{rel}:{node.lineno}: the @ operator (products go through oracle.exact.gemm)")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            base = node.left.operand if isinstance(node.left, ast.UnaryOp) else node.left
            if not (isinstance(base, ast.Constant) and isinstance(base.value, int | float)):
                problems.append(f"{rel}:{node.lineno}: ** on a non-constant base (tensor pow is not IEEE)")
    return torch_names, methods, problems


def _files():
    return [ROOT / f for f in A.EXACT_PATH_FILES] + sorted((ROOT / "oracle/exact").glob("*.py"))


def test_exact_path_files_exist():
    for f in A.EXACT_PATH_FILES:
        assert (ROOT / f).is_file(), f"{f} is on the exact path list but does not exist"


def test_exact_paths_use_only_allowed_torch_ops():
    bad = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        names, methods, problems = scan(path)
        bad += problems
        bad += [f"{rel}:{ln}: {n}" for n, ln in sorted(names) if n not in A.TORCH_NAMES]
        bad += [f"{rel}:{ln}: tensor method .{m}()" for m, ln in sorted(methods) if m not in A.TENSOR_METHODS]
    assert not bad, "torch ops outside the exact-v1 allow list (oracle/exact/allowed_ops.py):\n" + "\n".join(
        bad
    )


def test_the_audit_refuses_stock_sqrt_and_hidden_ops(tmp_path):
    """Positive control: the scan sees torch.sqrt, .rsqrt(), a tensor power, @ and an import
    that would hide a torch function from it."""
    p = tmp_path / "probe.py"
    p.write_text("import torch\nfrom torch import sqrt\n\ndef f(x, y):\n"
                 "    return torch.sqrt(x) + x.rsqrt() + x ** 2 + (x @ y)\n")
    names, methods, problems = scan(p, "probe.py")
    assert ("torch.sqrt", 5) in names and "torch.sqrt" not in A.TORCH_NAMES
    assert ("rsqrt", 5) in methods and "rsqrt" not in A.TENSOR_METHODS
    assert "sqrt" not in A.TENSOR_METHODS
    assert len(problems) == 3 and any("from torch" in m for m in problems)


def _doc_table(section: str) -> dict[str, str]:
    """name -> class from the rows `| `name` | class | why |` of one table of docs/exact-v1.md §11."""
    text = (ROOT / "docs/exact-v1.md").read_text()
    body = text.split("## 11. Stock torch operations on exact paths", 1)[1].split("\n## ", 1)[0]
    part = body.split(f"### {section}", 1)[1].split("\n### ", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)` \| ([a-z-]+) \|", part, re.M)}


def test_the_doc_lists_exactly_the_allowed_names():
    assert _doc_table("torch functions and attributes") == A.TORCH_NAMES
    assert _doc_table("Tensor methods") == A.TENSOR_METHODS
    assert _doc_table("Operators on tensors") == A.OPERATORS
