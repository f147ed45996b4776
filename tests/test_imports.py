"""No import cycles between the project's modules.

Every module of the installed packages (``joker_ext``, with ``joker_ext.adapters`` from the ``adapters/`` folder
and ``joker_ext.comparisons`` from ``comparisons/``) is found with pkgutil, its source parsed with ``ast``, and
every import it makes (at module level and inside functions alike: a function-local import only hides a cycle
until the function runs) becomes an edge to the project module it names. Imports under ``if TYPE_CHECKING:``
are not run and are left out.
"""
import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

# joker_ext.adapters is named too: it is installed from the folder adapters/, which an editable install maps
# into joker_ext without putting it on joker_ext.__path__ (so walking joker_ext alone would not see it).
PACKAGES = ("joker_ext", "joker_ext.adapters", "joker_ext.comparisons")

# Edges (importer, imported) that are allowed to close a cycle, each with the reason. Keep this list empty: each
# entry would be a layering problem waiting to be fixed (the test below still fails on a stale entry).
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def _modules():
    """{module name: source path} for every module and package of PACKAGES."""
    found = {}
    for top in PACKAGES:
        pkg = importlib.import_module(top)
        found[top] = pkg.__file__
        for info in pkgutil.walk_packages(pkg.__path__, prefix=top + "."):
            spec = importlib.util.find_spec(info.name)
            if spec is not None and spec.origin and spec.origin.endswith(".py"):
                found[info.name] = spec.origin
    return found


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree):
    """Every Import / ImportFrom node of ``tree`` (anywhere), less those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(name, modules):
    """The longest prefix of the dotted ``name`` that is a project module (None if there is none)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in modules:
            return cand
    return None


def import_graph(modules=None):
    """{module: {project modules it imports}} for the project's modules."""
    modules = _modules() if modules is None else modules
    graph = {}
    for name, path in modules.items():
        is_pkg = Path(path).name == "__init__.py"
        package = name if is_pkg else name.rpartition(".")[0]
        edges = set()
        for node in _imports(ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module
                # ``from pkg import sub`` imports the module pkg.sub when there is one, else names of pkg
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != name:
                    edges.add(resolved)
        graph[name] = edges
    return graph


def find_cycles(graph, allowed=()):
    """One cycle (a list of modules, first == last) for each strongly connected component with more than one
    module, the ``allowed`` edges left out of the graph."""
    allowed = set(allowed)
    g = {a: {b for b in bs if (a, b) not in allowed and b in graph} for a, bs in graph.items()}
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []
    counter = [0]

    def strongconnect(v):  # Tarjan's algorithm (the graph has ~100 nodes: recursion is fine)
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(set(comp))

    for v in sorted(g):
        if v not in index:
            strongconnect(v)

    cycles = []
    for comp in sccs:
        start = min(comp)
        # breadth-first search for the shortest way back to ``start`` inside the component
        prev, frontier = {start: None}, [start]
        path = None
        while frontier and path is None:
            nxt = []
            for v in frontier:
                for w in sorted(g[v] & comp):
                    if w == start:
                        path = [w]
                        while v is not None:
                            path.append(v)
                            v = prev[v]
                        path.reverse()  # start -> ... -> v -> start
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if path is not None:
                    break
            frontier = nxt
        cycles.append((sorted(comp), path))
    return cycles


def test_the_walk_sees_the_whole_project():
    graph = import_graph()
    for name in ("joker_ext.estimators", "joker_ext.model", "joker_ext.checkpoint", "joker_ext.adapters.falkon",
                 "joker_ext.adapters.sklearn", "joker_ext.comparisons.runner", "joker_ext.comparisons.reporting",
                 "joker_ext.comparisons.backends"):
        assert name in graph
    # function-local imports count: model imports checkpoint only inside its methods
    assert "joker_ext.solver" in graph["joker_ext.model"]


def test_the_cycle_finder_finds_cycles():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    ((comp, path),) = find_cycles(g)
    assert comp == ["a", "b", "c"] and path == ["a", "b", "c", "a"]
    assert find_cycles(g, allowed={("c", "a")}) == []
    assert find_cycles({"x": {"y"}, "y": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    for edge in KNOWN_EXCEPTIONS:  # an exception that no longer exists should be removed from the list
        assert edge[1] in graph.get(edge[0], ()), f"stale known exception {edge}: remove it"
    for edge in KNOWN_EXCEPTIONS:  # so should one that no longer closes a cycle (the list stays minimal)
        assert find_cycles(graph, allowed=set(KNOWN_EXCEPTIONS) - {edge}), \
            f"known exception {edge} closes no cycle any more: remove it"
    cycles = find_cycles(graph, allowed=KNOWN_EXCEPTIONS)
    if cycles:
        lines = [f"  {' -> '.join(path)}   (component: {', '.join(comp)})" for comp, path in cycles]
        pytest.fail("import cycles between the project's modules:\n" + "\n".join(lines))


def test_the_engine_registry_imports_no_engine():
    """joker_ext.engines is the registry only; the engines import it and joker_ext.builtin_engines imports them."""
    graph = import_graph()
    engines = {"joker_ext.solver", "joker_ext.active_set", "joker_ext.working_set", "joker_ext.newton_exact",
               "joker_ext.primal_newton"}
    assert not graph["joker_ext.engines"] & (engines | {"joker_ext.builtin_engines"})
    assert engines <= graph["joker_ext.builtin_engines"]
    assert "joker_ext.builtin_engines" in graph["joker_ext"]
    assert graph["joker_ext.results"] == set()  # SolverResult's module is a leaf


def test_importing_the_registry_alone_registers_the_builtin_engines():
    """A fresh interpreter that imports only joker_ext.engines finds every built-in engine (``import
    joker_ext.engines`` runs ``joker_ext/__init__.py``, which imports joker_ext.builtin_engines)."""
    import subprocess
    import sys

    code = ("import joker_ext.engines as e; print(sorted(e.available_solvers('exact'))); "
            "print(sorted(e.available_solvers('features'))); print(e.supports_intercept('working_set', 'exact'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == str(sorted(["auto", "active_set", "dbcd_tr", "newton", "working_set"]))
    assert out[1] == str(sorted(["auto", "dbcd_tr", "newton"]))
    assert out[2] == "True"


def test_a_new_cycle_in_the_real_graph_fails():
    """The machinery still catches a cycle: putting back the registry's old function-local import of an engine
    closes one."""
    graph = import_graph()
    assert find_cycles(graph) == []
    graph["joker_ext.engines"] = graph["joker_ext.engines"] | {"joker_ext.working_set"}
    ((comp, path),) = find_cycles(graph)
    assert "joker_ext.engines" in comp and "joker_ext.working_set" in comp and path[0] == path[-1]
