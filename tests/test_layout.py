"""The package's layering, read from the source: core -> adapters / cpu / tasks -> plugin entry point and tools ->
cli. No module imports a layer above its own (function-level imports included), and no import circle."""

import ast
import pathlib

import tba_ext

ROOT = pathlib.Path(tba_ext.__file__).parent
LAYER = {"core": 0, "adapters": 1, "cpu": 1, "tasks": 1, "verl_plugin": 2, "tools": 2, "cli": 3}


def modules():
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        yield "tba_ext." + ".".join(rel.parts).removesuffix(".__init__"), path


def imports(path, top_level_only=False):
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tba_ext"):
            yield node.module
            for alias in node.names:  # from tba_ext.core import tb
                yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("tba_ext"))


def layer(module):
    parts = module.split(".")
    return LAYER.get(parts[1]) if len(parts) > 1 else None


def test_no_module_imports_a_layer_above_its_own():
    upward = [
        (name, target)
        for name, path in modules()
        for target in imports(path)
        if layer(name) is not None and layer(target) is not None and layer(target) > layer(name)
    ]
    assert not upward


def test_no_import_circle_at_module_level():
    names = dict(modules())
    graph = {
        name: {t for t in imports(path, top_level_only=True) if t in names and t != name}
        for name, path in names.items()
    }
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                raise AssertionError(" -> ".join(stack + [node, nxt]))
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [])
