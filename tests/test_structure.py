"""The package's layering, checked from its source with ``ast`` (no import of stair_es needed).

* No import circle: no module of ``stair_es`` imports, directly or through others, a module
  that imports it -- counting imports inside functions (the lazy imports that keep cold start
  fast), not counting ``if TYPE_CHECKING:`` blocks (never run).
* No ``noqa: SLF001``: no module reaches into another's private attributes.
* Short files and parameter lists: no module of ``stair_es`` (its CLI included) or ``benchmarks`` over 800
  lines, no function over 12 parameters (``self``/``cls``, ``*args`` and ``**kwargs`` not counted;
  numba kernels and click commands, whose parameters are the options, excepted), beyond the
  listed ones still to be shortened.

Run ``python tests/test_structure.py`` to print the graph's circles and the suppressions.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "stair_es"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every import statement that can run (at module level or inside functions)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """Module -> the stair_es modules it imports (``from pkg import sub`` counts as importing ``pkg.sub``)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                for a in node.names:
                    sub = f"{prefix}.{a.name}"
                    targets.append(sub if sub in mods else prefix)
            for t in targets:
                while t and t not in mods and "." in t:  # `import stair_es.engine.index as x` style names
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != name:
                    graph[name].add(t)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # recursion depth is bounded by the package's module count
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def a_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One concrete circle through the first module of ``comp`` (for the failure message)."""
    members, start = set(comp), comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, v, start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


_SLF = re.compile(r"noqa:[^\n]*SLF001")


def slf001_suppressions() -> list[str]:
    hits = []
    for folder in ("stair_es", "benchmarks", "scripts", "tests"):
        for p in sorted((ROOT / folder).rglob("*.py")):
            if p == Path(__file__).resolve():
                continue
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
                if _SLF.search(line):
                    hits.append(f"{p.relative_to(ROOT)}:{n}")
    return hits


def test_the_checker_sees_function_level_imports_and_package_relative_names():
    graph = import_graph()
    assert "stair_es.engine" in graph and "stair_es.backends.embedded" in graph
    assert "stair_es.engine" in graph["stair_es.backends.embedded"]  # `from ..engine import EngineIndex`
    # `hybrid_search` is one call away for the CLI: the backends import fusion, not the other way round
    assert "stair_es.fusion" in graph["stair_es.hybrid"]


def test_no_import_circles():
    graph = import_graph()
    found = [" -> ".join(a_cycle(graph, c)) for c in circles(graph)]
    assert not found, "import circles (a module imports, through others, a module importing it):\n" + "\n".join(found)


def test_no_private_reach_ins():
    found = slf001_suppressions()
    assert not found, "`noqa: SLF001` (a private attribute used from outside its class): " + ", ".join(found)


MAX_LINES, MAX_PARAMS = 800, 12
#: Still over the limits, each to be shortened by its owner (an entry that is no longer over may go).
KNOWN_LONG_FILES: set[str] = set()
KNOWN_LONG_SIGNATURES: set[str] = set()


def _sources() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])


def long_files() -> list[str]:
    return [f"{p.relative_to(ROOT)} ({n} lines)" for p in _sources()
            if (n := p.read_text(encoding="utf-8").count("\n")) > MAX_LINES]


def _decorator_names(fn: ast.AST) -> set[str]:
    names = set()
    for d in fn.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        names.add(d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", ""))
    return names


def long_signatures() -> list[tuple[str, int]]:
    """(``path:Class.function``, parameter count) of every function over MAX_PARAMS parameters."""
    out = []
    for p in _sources():
        tree = ast.parse(p.read_text(encoding="utf-8"), str(p))
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                name = f"{prefix}{getattr(child, 'name', '')}"
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = child.args
                    n = sum(x.arg not in ("self", "cls") for x in a.posonlyargs + a.args + a.kwonlyargs)
                    if n > MAX_PARAMS and not _decorator_names(child) & {"njit", "jit", "vectorize", "guvectorize", "command"}:
                        out.append((f"{p.relative_to(ROOT)}:{name}", n))
                    stack.append((child, name + "."))
                elif isinstance(child, ast.ClassDef):
                    stack.append((child, name + "."))
    return sorted(out)


def test_no_long_files():
    found = [f for f in long_files() if f.split(" (")[0] not in KNOWN_LONG_FILES]
    assert not found, f"modules over {MAX_LINES} lines (split them by job): " + ", ".join(found)


def test_no_long_parameter_lists():
    found = [f"{name} ({n})" for name, n in long_signatures() if name not in KNOWN_LONG_SIGNATURES]
    assert not found, (f"functions over {MAX_PARAMS} parameters (pass a dataclass, or build it from the caller's "
                       "keyword arguments): " + ", ".join(found))


def test_every_package_folder_is_in_the_wheel():
    """A folder of modules under stair_es/ that pyproject.toml does not list is left out of a
    built wheel (the editable install the tests use would still find it): list it there."""
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]
    listed = set(config["packages"])
    packages = {".".join(folder.relative_to(ROOT).parts) for folder in (ROOT / "stair_es").rglob("*")
                if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py"))}
    missing = sorted(packages - listed)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"


if __name__ == "__main__":
    g = import_graph()
    cs = circles(g)
    print(f"{len(g)} modules, {sum(map(len, g.values()))} imports, {len(cs)} circles")
    for c in cs:
        print(f"  {len(c)} modules: " + " -> ".join(a_cycle(g, c)))
    s = slf001_suppressions()
    print(f"{len(s)} noqa: SLF001")
    for h in s:
        print("  " + h)
    print(f"files over {MAX_LINES} lines: " + (", ".join(long_files()) or "none"))
    print(f"functions over {MAX_PARAMS} parameters: " + (", ".join(f"{f} ({n})" for f, n in long_signatures()) or "none"))

