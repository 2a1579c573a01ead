"""The layering the README promises, checked on the source (imports read with `ast`, function-local
and TYPE_CHECKING ones included): layers import downward only (tools -> build -> codegen/emit ->
optimize -> frontend -> spec/targets), no import circle even behind a local import, no private
name across packages, the techniques reach the scheduler only through its contract, and nothing
outside the backends and targets tests which kind of device a target is."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "packager"
# top-level module or package -> layer (an import may only go to the same layer or below)
LAYERS = {"cli": 6, "tools": 6, "build": 5, "codegen": 4, "emit": 4, "optimize": 3, "frontend": 2,
          "spec": 1, "targets": 1, "errors": 0, "progress": 0, "cache": 0, "supervise": 0, "": 0}
# what the rest of the packager may import from optimize/schedule (the scheduling contract)
SCHEDULE_PUBLIC = {"contract", "registry", "hardware", "phases", "measure.database", "measure.compile"}
SCHEDULE = "packager.optimize.schedule"
# where a target's kind may be tested: the backends, the targets, and the scheduler registry
KIND_ALLOWED = ("packager.codegen.", "packager.targets", "packager.optimize.schedule.registry")


@dataclass(frozen=True)
class Import:
    src: str            # importing module
    dst: str            # imported module
    name: str           # imported name ("" for `import x`)
    line: int
    local: bool         # inside a function
    type_only: bool     # under `if TYPE_CHECKING:`


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in ROOT.rglob("*.py")}


def _imports(mod: str) -> list[Import]:
    path = MODULES[mod]
    out: list[Import] = []

    def visit(node: ast.AST, local: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, True, type_only)
            elif isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING"):
                visit(child, local, True)
            elif isinstance(child, ast.ImportFrom):
                base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                target = ".".join(base[:len(base) - child.level + 1] + [child.module or ""]).rstrip(".") \
                    if child.level else child.module
                if target and target.startswith("packager"):
                    for a in child.names:
                        sub = f"{target}.{a.name}"
                        out.append(Import(mod, sub if sub in MODULES else target, a.name, child.lineno, local,
                                          type_only))
            elif isinstance(child, ast.Import):
                out.extend(Import(mod, a.name, "", child.lineno, local, type_only)
                           for a in child.names if a.name.startswith("packager"))
            else:
                visit(child, local, type_only)

    visit(ast.parse(path.read_text()), False, False)
    return out


IMPORTS = [i for m in sorted(MODULES) for i in _imports(m)]


def _top(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def _area(mod: str) -> str:
    """The package an import stays inside of: optimize's subpackages count as their own."""
    parts = mod.split(".")
    return ".".join(parts[:3]) if len(parts) > 2 and parts[1] == "optimize" else ".".join(parts[:2])


def test_every_module_has_a_layer():
    assert {_top(m) for m in MODULES} <= set(LAYERS)


def test_layers_import_downward_only():
    up = [f"{i.src}:{i.line} imports {i.dst}" for i in IMPORTS if LAYERS[_top(i.dst)] > LAYERS[_top(i.src)]]
    assert not up, "\n".join(up)


def test_no_import_circle_even_behind_a_local_import():
    g = nx.DiGraph((i.src, i.dst) for i in IMPORTS if not i.type_only and i.dst in MODULES and i.src != i.dst)
    # a package's __init__ importing its own modules is not a circle through them
    g.remove_edges_from([(a, b) for a, b in list(g.edges) if b.startswith(a + ".")])
    circles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert not circles, circles


def test_no_private_name_crosses_a_package():
    crossing = [f"{i.src}:{i.line} imports {i.dst}.{i.name}" for i in IMPORTS
                if i.name.startswith("_") and not i.name.startswith("__") and _area(i.src) != _area(i.dst)]
    assert not crossing, "\n".join(crossing)


def test_the_techniques_reach_the_scheduler_through_its_contract():
    inside = [f"{i.src}:{i.line} imports {i.dst}" for i in IMPORTS
              if i.dst.startswith(SCHEDULE + ".") and not i.src.startswith(SCHEDULE + ".")
              and i.dst.removeprefix(SCHEDULE + ".") not in SCHEDULE_PUBLIC]
    assert not inside, "\n".join(inside)


def _kind_tests(mod: str) -> list[str]:
    """`<target>.kind` in a comparison, or isinstance(x, <a Target class>)."""
    found = []
    for node in ast.walk(ast.parse(MODULES[mod].read_text())):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if isinstance(side, ast.Attribute) and side.attr == "kind" and "target" in ast.unparse(side.value):
                    found.append(f"{mod}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "isinstance" and len(node.args) == 2 \
                and "Target" in ast.unparse(node.args[1]):
            found.append(f"{mod}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_pass_asks_which_kind_of_device_a_target_is():
    tests = [t for m in MODULES if not m.startswith(KIND_ALLOWED) for t in _kind_tests(m)]
    assert not tests, "\n".join(tests)


def test_the_kind_check_finds_a_planted_test(tmp_path, monkeypatch):
    planted = tmp_path / "planted.py"
    planted.write_text("def f(ctx):\n    return ctx.target.kind == 'cpu' or isinstance(ctx.target, CudaTarget)\n")
    monkeypatch.setitem(MODULES, "packager.optimize.planted", planted)
    assert len(_kind_tests("packager.optimize.planted")) == 2
