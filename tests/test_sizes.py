"""CONTRIBUTING's limits in ``cli/``, ``apps/``, ``registration/``, ``training/`` and
``figures/``: no file over 500 lines, no function over 80 (docstrings aside, signature
included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hyperreg"
LIMITED = ("cli", "apps", "registration", "training", "figures")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function (decorators aside), less its docstring."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):
            lines -= first.end_lineno - first.lineno + 1
    return lines


def test_files_and_functions_are_small() -> None:
    too_long = []
    for path in sorted(p for name in LIMITED for p in (PACKAGE / name).glob("*.py")):
        text = path.read_text()
        if text.count("\n") > MAX_FILE_LINES:
            too_long.append(f"{path.relative_to(PACKAGE)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _function_lines(node) > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}()")
    assert not too_long, too_long
