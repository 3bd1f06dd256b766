"""Structure rules checked on the source: no import circle, one folder per process role with no import
from a lower layer to a higher one (wire < agent, controller; slurm library < slurm.proc), product
code never imports the benchmarks, small controller modules, no lazy state."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tmslurm

ROOT = Path(tmslurm.__file__).parent


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, at any depth (lazy imports too), with ``from X import Y``
    also giving ``X.Y`` (Y may be a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def _graph() -> dict[str, set[str]]:
    """Every import of a tmslurm module by another."""
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        graph[name] = {t for t in _imports(path) if t in modules and t != name and not name.startswith(t + ".")}
    return graph


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


# (importer, imported): modules under the first never import modules under the second
FORBIDDEN = [
    ("tmslurm.wire", "tmslurm.agent"),
    ("tmslurm.wire", "tmslurm.controller"),
    ("tmslurm.agent", "tmslurm.controller"),
    ("tmslurm.controller", "tmslurm.agent"),
    ("tmslurm.controller", "tmslurm.slurm"),
    ("tmslurm.comm", "tmslurm.agent"),
    ("tmslurm.comm", "tmslurm.controller"),
    ("tmslurm.train", "tmslurm.agent"),
    ("tmslurm.train", "tmslurm.controller"),
    ("tmslurm.core", "tmslurm.agent"),
    ("tmslurm.core", "tmslurm.controller"),
]


@pytest.mark.parametrize("importer,imported", FORBIDDEN)
def test_no_import_from_a_lower_layer_to_a_higher_one(importer, imported):
    bad = sorted(
        f"{a} -> {b}" for a, targets in _graph().items() if _under(a, importer) for b in targets if _under(b, imported)
    )
    assert bad == []


# the role packages around the process folders (docs/architecture.md, "The tree")
ROLE_PACKAGES = ("core", "cli", "run", "tools")
PROCESS_PACKAGES = ("wire", "comm", "train", "agent", "controller", "slurm")
LOOSE_MODULES_MAX = 6


def test_few_modules_are_left_loose_and_every_role_package_states_its_contract():
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(loose) <= LOOSE_MODULES_MAX, f"{loose}: put a module in the package of its role"
    for pkg in ROLE_PACKAGES + PROCESS_PACKAGES:
        init = ROOT / pkg / "__init__.py"
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text())), f"{pkg}/ states no contract"
    assert {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()} <= set(
        ROLE_PACKAGES + PROCESS_PACKAGES
    ), "a new package: name its role in test_layering and docs/architecture.md"


def _importers_of(package: str) -> list[str]:
    return sorted(
        f"{a} -> {b}"
        for a, targets in _graph().items()
        if not _under(a, package)
        for b in targets
        if _under(b, package)
    )


def test_core_imports_no_process_and_no_role_code():
    """core/ holds what every process shares: it may use the wire messages, nothing above them."""
    above = [p for p in ROLE_PACKAGES + PROCESS_PACKAGES if p not in ("core", "wire")]
    bad = sorted(
        f"{a} -> {b}"
        for a, targets in _graph().items()
        if _under(a, "tmslurm.core")
        for b in targets
        if any(_under(b, f"tmslurm.{p}") for p in above)
    )
    assert bad == []


def test_commands_and_tools_sit_on_top():
    """Nothing a run's processes import is a command or a checking tool; the API may use the commands."""
    cli = [x for x in _importers_of("tmslurm.cli") if not x.startswith(("tmslurm.tools", "tmslurm.api "))]
    assert cli == []
    assert _importers_of("tmslurm.tools") == []


def test_only_the_commands_and_the_batch_step_start_runs():
    allowed = ("tmslurm.cli", "tmslurm.slurm.proc", "tmslurm.api", "tmslurm.tools")
    assert [x for x in _importers_of("tmslurm.run") if not x.startswith(allowed)] == []


def test_the_slurm_library_imports_no_process_code():
    procs = (
        "tmslurm.slurm.proc",
        "tmslurm.agent",
        "tmslurm.controller",
        "tmslurm.cli.launch",
        "tmslurm.run.supervisor",
    )
    bad = sorted(
        f"{a} -> {b}"
        for a, targets in _graph().items()
        if _under(a, "tmslurm.slurm") and not _under(a, "tmslurm.slurm.proc")
        for b in targets
        if any(_under(b, p) for p in procs)
    )
    assert bad == []


def test_the_product_never_imports_the_benchmarks():
    bad = sorted(f"{_module(p)} -> {t}" for p in ROOT.rglob("*.py") for t in _imports(p) if _under(t, "benchmarks"))
    assert bad == []
    assert not (ROOT / "bench").exists() and not (ROOT / "sim").exists()


def test_every_process_folder_exists_with_a_contract():
    for pkg in ("wire", "agent", "controller", "slurm", "slurm/proc"):
        init = ROOT / pkg / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{pkg}/__init__.py states no contract"


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


@pytest.mark.parametrize("folder", ["controller", "agent"])
def test_process_modules_are_small_and_build_their_state_up_front(folder):
    for path in (ROOT / folder).glob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) <= 400, path.name
        assert "getattr(self" not in text, path.name
        assert ast.get_docstring(ast.parse(text)), f"{path.name} has no contract docstring"
