"""The package's modules import each other one way (no import circles), and a long
module says why it is long.

Every module of ``scrapy_dist`` is parsed (not imported) and every import statement in it
counts, wherever it stands: at module level, inside a function, under ``TYPE_CHECKING``.
``from scrapy_dist import x`` counts as an import of ``scrapy_dist.x`` when that is a
module, and relative imports are resolved against the importing module. A package's
``__init__`` that Python runs on the way to a submodule is not counted: only the module
an import statement names.

The one circle allowed is :mod:`scrapy_dist.scheduler` and :mod:`scrapy_dist.unleased`
(the scheduler for crawls without leases is a subclass the scheduler's factory picks).

A module of more than :data:`LONG` lines states at the top of its docstring why it is
one module "on purpose" (one concept per module: a longer one is split along its
concepts, or says why not).

Text only: nothing is imported and no Redis is needed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "scrapy_dist"

#: The import circles allowed, each as the set of its modules.
ALLOWED = [frozenset({"scrapy_dist.scheduler", "scrapy_dist.unleased"})]
#: Lines past which a module says in its docstring why it is that long ("on purpose").
LONG = 600


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _owner(name: str, known: dict[str, Path]) -> str | None:
    """The module of the package that ``name`` (a module or a name in one) is, if any."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imported(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of the package that ``module`` imports, anywhere in its file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                names.append(submodule if submodule in known else source)
    owners = {_owner(name, known) for name in names}
    return {owner for owner in owners if owner is not None and owner != module}


def graph() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports."""
    known = modules()
    return {module: imported(module, path, known) for module, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def describe(circle: frozenset[str], edges: dict[str, set[str]]) -> str:
    """A circle's modules and the imports that tie them."""
    ties = [
        f"    {module} -> {target}"
        for module in sorted(circle)
        for target in sorted(edges[module] & circle)
    ]
    return f"  {', '.join(sorted(circle))}:\n" + "\n".join(ties)


def test_the_graph_sees_the_package() -> None:
    edges = graph()
    assert "scrapy_dist.frontier.core" in edges
    assert "scrapy_dist.scripts" in edges["scrapy_dist.frontier.core"]
    assert "scrapy_dist.scheduler" in edges["scrapy_dist.unleased"]


def test_the_circles_tell_each_component() -> None:
    edges = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "d": {"e"}, "e": {"f"}, "f": {"d"}}
    assert sorted(circles(edges), key=sorted) == [{"a", "b"}, {"d", "e", "f"}]


def test_no_import_circle_but_the_scheduler_and_unleased() -> None:
    edges = graph()
    unexpected = [circle for circle in circles(edges) if circle not in ALLOWED]
    assert not unexpected, "import circles in scrapy_dist (module -> module it imports):\n" + (
        "\n".join(describe(circle, edges) for circle in unexpected)
    )


def test_a_long_module_says_why_on_purpose() -> None:
    silent = []
    for module, path in modules().items():
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines <= LONG:
            continue
        docstring = ast.get_docstring(ast.parse(text, str(path))) or ""
        if "on purpose" not in docstring:
            silent.append(f"  {module}: {lines} lines")
    assert not silent, (
        f"modules over {LONG} lines whose docstring does not say why (split one along its "
        'concepts, or state the reason "on purpose" at the top of its docstring):\n'
        + "\n".join(silent)
    )
