"""The import graph of dsv41c's own modules: no cycle, and data flowing one way (frontend -> ir -> passes -> codegen ->
artifact -> runtime).

Every product module is read with `ast` (nothing is imported): each `import` and `from ... import` statement,
at module level and inside functions alike, is an edge to the dsv41c module it names (`from pkg import name` to
`pkg.name` where that is a module, else to `pkg`; relative imports resolved). Dynamic imports by name
(`importlib.import_module("...")`, the kernel registry's KERNEL_MODULES) are not edges.

The layering checked beside the cycles:
- the leaf modules (LEAVES) import only leaves;
- the runtime imports only itself, the leaves and the kernel library (codegen/triton/*, codegen/templates.py);
- the kernel library imports only itself and the leaves (no ir/, passes/, frontend/ or other codegen/ module);
- passes/ never imports the runtime.
"""
from __future__ import annotations

import ast
import os

import networkx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# modules every component may import: they import nothing of the compiler or the runtime
LEAVES = ("dsv41c.formats", "dsv41c.prims", "dsv41c.ops", "dsv41c.artifact_format", "dsv41c.outputs", "dsv41c.aten_targets",
          "dsv41c.seeded_weights")
KERNEL_LIBRARY = ("dsv41c.codegen.triton", "dsv41c.codegen.templates")
RUNTIME = ("dsv41c.runtime",)


def _components() -> dict:
    """import package -> folder: dsv41c/ itself and the component folders setup.py maps under it."""
    tree = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    names = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "COMPONENTS" for t in n.targets))
    return {"dsv41c": "dsv41c", **{f"dsv41c.{c}": c for c in names}}


def product_modules() -> dict:
    """module name -> file, for every .py file of dsv41c/ and the component folders."""
    mods = {}
    for pkg, folder in _components().items():
        base = os.path.join(ROOT, folder)
        for root, dirs, files in os.walk(base):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            if pkg == "dsv41c" and root == base:
                # a component folder that is also reachable under dsv41c/ (an installed layout) is scanned once
                dirs[:] = [d for d in dirs if f"dsv41c.{d}" not in _components()]
            for f in sorted(files):
                if f.endswith(".py"):
                    parts = os.path.relpath(os.path.join(root, f), base)[:-3].split(os.sep)
                    if parts[-1] == "__init__":
                        parts = parts[:-1]
                    mods[".".join([pkg, *parts])] = os.path.join(root, f)
    return mods


def imported_modules(source: str, module: str, is_package: bool, known) -> set:
    """The modules of `known` that `source` (the text of `module`) imports, at any depth of the syntax tree."""
    out = set()

    def nearest(name):
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(nearest(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in known else nearest(target))
    out.discard("")
    out.discard(module)
    return out


def import_graph() -> networkx.DiGraph:
    mods = product_modules()
    g = networkx.DiGraph()
    for m, path in mods.items():
        g.add_node(m)
        for t in imported_modules(open(path, encoding="utf-8").read(), m, path.endswith("__init__.py"), mods):
            g.add_edge(m, t)
    return g


GRAPH = import_graph()


def _under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _violations(sources, allowed) -> list:
    return sorted(f"{a} imports {b}" for a, b in GRAPH.edges if _under(a, sources) and not _under(b, allowed))


def test_the_scanner_sees_imports_inside_functions():
    known = {"dsv41c", "dsv41c.ir", "dsv41c.ir.core", "dsv41c.ir.printer", "dsv41c.codegen", "dsv41c.codegen.aot"}
    src = ("from . import printer\n"
           "def f():\n    from dsv41c.codegen.aot import build\n    import dsv41c.ir.core as c\n")
    assert imported_modules(src, "dsv41c.ir.core", False, known) == {"dsv41c.ir.printer", "dsv41c.codegen.aot"}
    assert len(GRAPH) > 100 and GRAPH.has_edge("dsv41c.runtime.loader", "dsv41c.runtime.executor")


def test_no_import_cycles():
    cycles = sorted(" -> ".join(c + [c[0]]) for c in networkx.simple_cycles(GRAPH))
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(cycles)


def test_leaves_import_only_leaves():
    bad = _violations(LEAVES, LEAVES)
    assert not bad, "a leaf module imports a component:\n" + "\n".join(bad)


def test_the_runtime_imports_no_compiler_module():
    bad = _violations(RUNTIME, RUNTIME + LEAVES + KERNEL_LIBRARY)
    assert not bad, "the runtime imports the compiler:\n" + "\n".join(bad)


def test_the_kernel_library_imports_only_itself_and_leaves():
    bad = _violations(KERNEL_LIBRARY, KERNEL_LIBRARY + LEAVES)
    assert not bad, "the kernel library (shared with the runtime) imports the compiler:\n" + "\n".join(bad)


def test_passes_never_import_the_runtime():
    bad = sorted(f"{a} imports {b}" for a, b in GRAPH.edges if _under(a, ("dsv41c.passes",)) and _under(b, RUNTIME))
    assert not bad, "\n".join(bad)
