"""The engine's shape, checked from its source with ``ast``: no module over 800 lines, no Python
function over 12 parameters (numba kernels excepted: they take what their loops read), and the
numba kernels and their numpy twins split into modules of the same names."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "stair_es" / "engine"
MAX_LINES = 800
MAX_PARAMS = 12


def _is_compiled(fn: ast.FunctionDef) -> bool:
    names = {ast.unparse(d).split("(")[0] for d in fn.decorator_list}
    return bool(names & {"njit", "intrinsic", "overload", "numba.njit"})


def test_no_engine_module_is_over_800_lines():
    long = {str(p.relative_to(ENGINE)): n for p in ENGINE.rglob("*.py")
            if (n := p.read_text(encoding="utf-8").count("\n")) > MAX_LINES}
    assert not long, f"engine modules over {MAX_LINES} lines: {long}"


def test_no_python_function_of_the_engine_takes_more_than_12_parameters():
    wide = []
    for p in sorted(ENGINE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _is_compiled(node):
                continue
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            n = len(names) - (names[:1] in (["self"], ["cls"])) + bool(a.vararg) + bool(a.kwarg)
            if n > MAX_PARAMS:
                wide.append(f"{p.relative_to(ENGINE)}:{node.lineno} {node.name} ({n})")
    assert not wide, f"functions over {MAX_PARAMS} parameters: {wide}"


def test_the_numpy_twins_follow_the_kernels_split():
    kernels = {p.stem for p in (ENGINE / "kernels").glob("*.py") if not p.stem.startswith("_")}
    twins = {p.stem for p in (ENGINE / "npkernels").glob("*.py") if not p.stem.startswith("_")}
    assert twins <= kernels, f"numpy twin modules without a numba module of the same name: {twins - kernels}"
    assert {"verify", "ids", "build", "heap", "taat", "blockmax", "search"} <= kernels
