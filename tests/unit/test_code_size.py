"""No function in the product over 60 lines and no module over 450, unless the allow-list says why.

Why a test: a long function is where a newcomer gets lost (issue #30), and nobody notices one growing
past the point where it should have been split. The limits are counted as a reader sees them: a
function from its ``def`` line to its last line (docstring and comments included), a module by its
lines. A function or module that must stay long is named below with the reason; an entry that is no
longer over its limit fails too, so the list only names what is still long.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ROOT / "operator" / "agentrun"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450

#: "path/under/agentrun.py::Qualified.name" (or the path alone, for a module) -> why it stays long.
ALLOWED: dict[str, str] = {}


def _functions(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Every function and method of a module, nested ones included: qualified name, length in lines."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                yield name, (child.end_lineno or child.lineno) - child.lineno + 1
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def too_long(root: Path = PRODUCT) -> dict[str, int]:
    """Every function over MAX_FUNCTION_LINES and module over MAX_MODULE_LINES under ``root``."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        source = path.read_text(encoding="utf-8")
        if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
            found[where] = lines
        for name, length in _functions(ast.parse(source)):
            if length > MAX_FUNCTION_LINES:
                found[f"{where}::{name}"] = length
    return found


def test_no_function_is_over_60_lines_and_no_module_over_450_unless_the_allow_list_says_why() -> None:
    unexplained = {name: lines for name, lines in too_long().items() if name not in ALLOWED}
    assert not unexplained, (
        f"split these (functions over {MAX_FUNCTION_LINES} lines, modules over {MAX_MODULE_LINES}), "
        f"or name them in ALLOWED with why they stay long: {unexplained}"
    )


def test_the_allow_list_names_only_what_is_still_too_long() -> None:
    stale = sorted(set(ALLOWED) - set(too_long()))
    assert not stale, f"no longer over the limit (or gone): remove from ALLOWED: {stale}"


def test_the_scan_counts_a_method_from_its_def_to_its_last_line(tmp_path: Path) -> None:
    body = "\n".join(f"        x = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "module.py").write_text(
        f"class C:\n    def long(self):\n{body}\n\n    def short(self):\n        pass\n"
    )
    assert too_long(tmp_path) == {"module.py::C.long": MAX_FUNCTION_LINES + 1}
