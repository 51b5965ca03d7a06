"""The package layout: layers import only downwards, no import cycles, no private names.

Layers, lowest first (a module may import its own layer and the layers below it):

0. base: ``hyperreg._checks``, ``hyperreg._errors``, ``hyperreg._files``, ``hyperreg.config``,
   ``hyperreg`` (the version only; the package's lazy re-exports are not imports), and
   ``hyperreg.figures`` (matplotlib figures; it needs nothing but ``hyperreg._files``)
1. ``hyperreg.method`` (the method) and ``hyperreg.geometry`` (files and geometry), side by side
   and independent of each other; ``hyperreg.pretrained`` (the bundled models, loaded through
   ``hyperreg.method.model``)
2. ``hyperreg.registration`` (running a model on a prepared pair)
3. ``hyperreg.training``
4. ``hyperreg.apps`` (register files, sweep, tune, batch, demo)
5. ``hyperreg.cli``

Every import statement counts, including those inside functions (lazy imports hide cycles).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hyperreg"

LAYERS = {
    "hyperreg": 0,
    "hyperreg._checks": 0,
    "hyperreg._errors": 0,
    "hyperreg._files": 0,
    "hyperreg.config": 0,
    "hyperreg.figures": 0,
    "hyperreg.method": 1,
    "hyperreg.geometry": 1,
    "hyperreg.pretrained": 1,
    "hyperreg.registration": 2,
    "hyperreg.training": 3,
    "hyperreg.apps": 4,
    "hyperreg.cli": 5,
    "hyperreg.__main__": 6,
}
INDEPENDENT = {frozenset({"hyperreg.method", "hyperreg.geometry"})}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer_of(module: str) -> str:
    for name in sorted(LAYERS, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    raise AssertionError(f"{module} belongs to no layer; add it to LAYERS in {__file__}")


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """``(module, imported names, line)`` of every hyperreg import in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "hyperreg":
                found.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "hyperreg":
                    found.append((alias.name, [], node.lineno))
    return found


def _graph() -> dict[str, list[tuple[str, list[str], int]]]:
    return {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _is_module(name: str) -> bool:
    base = PACKAGE.parent.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _edges(graph: dict[str, list[tuple[str, list[str], int]]]) -> dict[str, set[str]]:
    """Module -> modules it imports (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    edges: dict[str, set[str]] = {m: set() for m in graph}
    for module, imports in graph.items():
        for target, names, _ in imports:
            subs = [f"{target}.{n}" for n in names if _is_module(f"{target}.{n}")]
            edges[module].update(subs or [target])
    return edges


def test_every_module_is_in_a_layer() -> None:
    for module in _graph():
        _layer_of(module)


def test_no_upward_imports_between_layers() -> None:
    bad = []
    for module, imports in _graph().items():
        if module == "hyperreg":  # the package's lazy re-exports, see hyperreg/__init__.py
            continue
        own = _layer_of(module)
        for target, _, line in imports:
            other = _layer_of(target)
            if frozenset({own, other}) in INDEPENDENT or LAYERS[other] > LAYERS[own]:
                bad.append(f"{module}:{line} imports {target} ({other} is not below {own})")
    assert not bad, "\n".join(bad)


def test_no_private_names_from_other_modules() -> None:
    bad = []
    for module, imports in _graph().items():
        for target, names, line in imports:
            if target == module:
                continue
            private = [n for n in names if n.startswith("_") and n != "__version__"]
            if private:
                bad.append(f"{module}:{line} imports {private} from {target}")
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    edges = _edges(_graph())
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(edges.get(module, ())):
            if target not in edges:
                continue
            if state.get(target) == 1:
                cycle = [*stack[stack.index(target) :], target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state and module != "hyperreg":
            visit(module)


def test_path_like_is_defined_once() -> None:
    """The ``PathLike`` alias has one definition (``hyperreg.registration.pairs``); every other
    module imports it instead of spelling out its own copy."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            if any(isinstance(t, ast.Name) and t.id == "PathLike" for t in targets):
                found.append(f"{_module_name(path)}:{node.lineno}")
    assert len(found) == 1, f"PathLike is defined in {found}"


def test_the_checks_fail_on_a_bad_layout(tmp_path: Path) -> None:
    """The helpers above see what they must: a private name, an upward import, a lazy import."""
    source = tmp_path / "bad.py"
    source.write_text(
        "from hyperreg.method.spatial import _warp\n"
        "def f():\n    from hyperreg.cli import main\n"
    )
    imports = _imports(source)
    assert ("hyperreg.method.spatial", ["_warp"], 1) in imports
    assert ("hyperreg.cli", ["main"], 3) in imports
    assert LAYERS[_layer_of("hyperreg.cli")] > LAYERS[_layer_of("hyperreg.method.spatial")]


def test_curated_api_resolves_lazily() -> None:
    """Every name in ``hyperreg.__all__`` imports, and importing the package loads no torch."""
    import subprocess
    import sys

    code = (
        "import sys, hyperreg\n"
        "assert 'torch' not in sys.modules, 'import hyperreg loaded torch'\n"
        "missing = [n for n in hyperreg.__all__ if getattr(hyperreg, n, None) is None]\n"
        "assert not missing, missing\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
