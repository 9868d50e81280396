"""The size contract (issue 29): no class over 200 lines and no function over 60 in rl/, agents/, envs/,
evals/ and sandboxes/, measured with ``ast`` as ``end_lineno - lineno + 1`` (decorators not counted).

Argument-parser declarations are exempt: a function whose body (a docstring aside) is only

1. assignments of plain local names (the ingredients of help texts), before any parser exists;
2. ``P = argparse.ArgumentParser(...)`` (or ``ArgumentParser(...)``), once or more (parent parsers);
3. calls of :data:`DECLARING` methods on a parser, or on what :data:`NESTING` methods returned, as
   statements or assigned to plain names (``g = p.add_argument_group(...)``);
4. ``return P``, P a parser it built.

No ``if``, loop, ``with``, ``try`` or other statement: such a function declares options and does
nothing else, however long its help texts are. The rule reads the code; no function is exempt by name.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("rl", "agents", "envs", "evals", "sandboxes")
MAX_CLASS_LINES = 200
MAX_FUNCTION_LINES = 60

NESTING = frozenset({"add_argument_group", "add_mutually_exclusive_group", "add_subparsers", "add_parser"})
"""Methods that return something more options are declared on."""
DECLARING = NESTING | {"add_argument", "set_defaults"}


@dataclass(frozen=True)
class Offender:
    path: str  # relative to the repository root
    line: int
    name: str  # qualified within its module: Class.method
    lines: int
    limit: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name} has {self.lines} lines (limit {self.limit})"


def _is_parser_creation(value: ast.expr) -> bool:
    if not isinstance(value, ast.Call):
        return False
    f = value.func
    return (isinstance(f, ast.Name) and f.id == "ArgumentParser") or (
        isinstance(f, ast.Attribute) and f.attr == "ArgumentParser"
        and isinstance(f.value, ast.Name) and f.value.id == "argparse")


def _declaring_call(value: ast.expr, holders: set[str], methods: frozenset[str]) -> bool:
    """``holder.method(...)``: a call of one of ``methods`` on a parser or one of its groups."""
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in methods
            and isinstance(value.func.value, ast.Name) and value.func.value.id in holders)


def is_parser_declaration(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``fn`` only builds an argument parser and returns it (module docstring)."""
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body or not isinstance(body[-1], ast.Return):
        return False
    parsers: set[str] = set()
    holders: set[str] = set()  # parsers, and the groups and subparsers declared on them
    for stmt in body[:-1]:
        if isinstance(stmt, ast.Expr) and _declaring_call(stmt.value, holders, DECLARING):
            continue
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            return False
        target = stmt.targets[0].id
        if _is_parser_creation(stmt.value):
            parsers.add(target)
            holders.add(target)
        elif _declaring_call(stmt.value, holders, NESTING):
            holders.add(target)
        elif parsers:  # a plain assignment once the parser exists: not a declaration any more
            return False
    returned = body[-1].value
    return isinstance(returned, ast.Name) and returned.id in parsers


def offenders_in(source: str, path: str) -> list[Offender]:
    """The classes over :data:`MAX_CLASS_LINES` and the functions over :data:`MAX_FUNCTION_LINES` in
    ``source``, parser declarations aside."""
    found: list[Offender] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                size = child.end_lineno - child.lineno + 1  # type: ignore[operator]
                if isinstance(child, ast.ClassDef):
                    limit = MAX_CLASS_LINES
                else:
                    limit = MAX_FUNCTION_LINES if not is_parser_declaration(child) else size
                if size > limit:
                    found.append(Offender(path, child.lineno, name, size, limit))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def all_offenders() -> list[Offender]:
    found: list[Offender] = []
    for folder in FOLDERS:
        for file in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in file.parts:
                continue
            found += offenders_in(file.read_text(encoding="utf-8"), file.relative_to(ROOT).as_posix())
    return found


def test_no_class_over_200_lines_and_no_function_over_60():
    found = all_offenders()
    assert not found, ("over the size contract (split by concept, or, for an argument parser, declare options "
                     "only; see tests/test_code_size.py):\n" + "\n".join(map(str, found)))


def test_the_sao_eval_parser_is_exempt_by_the_rule():
    path = ROOT / "evals" / "cli.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    build = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "build_parser")
    assert build.end_lineno - build.lineno + 1 > MAX_FUNCTION_LINES  # type: ignore[operator]
    assert is_parser_declaration(build)


# -- the checker itself, on synthetic code --------------------------------------------------------------

def _function(name: str, lines: int) -> str:
    """A function of exactly ``lines`` lines."""
    return f"def {name}():\n" + "".join(f"    x{i} = {i}\n" for i in range(lines - 2)) + "    return x0\n"


def _parser_builder(options: int, extra: str = "") -> str:
    return ("def build_parser():\n"
            '    """The options."""\n'
            '    names = ", ".join(["a", "b"])\n'
            "    p = argparse.ArgumentParser(prog='x', description=f'benchmarks: {names}')\n"
            "    g = p.add_argument_group('more')\n"
            "    sub = p.add_subparsers(dest='cmd')\n"
            "    run = sub.add_parser('run')\n"
            "    run.set_defaults(func=print)\n"
            + "".join(f"    g.add_argument('--o{i}', type=int, help=f'option {{names}}')\n" for i in range(options))
            + extra + "    return p\n")


def test_the_checker_flags_61_lines_and_201_lines_and_no_fewer():
    assert offenders_in(_function("ok", 60), "m.py") == []
    assert [str(o) for o in offenders_in(_function("long", 61), "m.py")] == ["m.py:1: long has 61 lines (limit 60)"]
    cls = "class Big:\n" + textwrap.indent(_function("f", 50) * 4, "    ")  # 1 + 200 lines
    assert [(o.name, o.lines) for o in offenders_in(cls, "m.py")] == [("Big", 201)]
    assert offenders_in("class Fits:\n" + textwrap.indent(_function("f", 50) * 3 + _function("g", 49), "    "),
                        "m.py") == []
    method = "class C:\n    x = 1\n" + textwrap.indent("async " + _function("slow", 70), "    ")
    assert [(o.line, o.name, o.lines) for o in offenders_in(method, "m.py")] == [(3, "C.slow", 70)]


def test_a_parser_builder_is_exempt_and_nothing_more():
    builder = _parser_builder(80)
    assert offenders_in(builder, "cli.py") == []
    assert is_parser_declaration(ast.parse(builder).body[0])  # type: ignore[arg-type]
    for extra in ("    if True:\n        p.add_argument('--x')\n",  # control flow
                  "    print('side effect')\n",  # a call that declares nothing
                  "    p.parse_args([])\n",  # a parser method that is not a declaration
                  "    other.add_argument('--y')\n",  # not on a parser it built
                  "    late = 1\n"):  # an assignment once the parser exists
        assert not is_parser_declaration(ast.parse(_parser_builder(80, extra)).body[0]), extra  # type: ignore[arg-type]
        assert len(offenders_in(_parser_builder(80, extra), "cli.py")) == 1, extra
    not_returned = _parser_builder(80).replace("    return p\n", "    return None\n")
    assert not is_parser_declaration(ast.parse(not_returned).body[0])  # type: ignore[arg-type]
