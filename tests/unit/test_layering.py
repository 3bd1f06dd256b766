"""Structure rules checked on the source: no import circle, small controller modules, no lazy state."""

from __future__ import annotations

import ast
from pathlib import Path

import tmslurm

ROOT = Path(tmslurm.__file__).parent


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Every import of a tmslurm module by another, at any depth (lazy imports too)."""
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tmslurm"):
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("tmslurm")]
            graph[name] |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    graph = {k: {t for t in v if not t.startswith("tmslurm.") or t in v} for k, v in _graph().items()}
    # a package's __init__ re-exporting its own modules is not a circle
    for pkg in [m for m in graph if (ROOT.parent / m.replace(".", "/") / "__init__.py").exists()]:
        graph[pkg] = {t for t in graph[pkg] if not t.startswith(pkg + ".")}
    assert _cycles(graph) == []


def test_controller_modules_are_small_and_build_their_state_up_front():
    for path in (ROOT / "controller").glob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) <= 400, path.name
        assert "getattr(self" not in text, path.name
        assert ast.get_docstring(ast.parse(text)), f"{path.name} has no contract docstring"
