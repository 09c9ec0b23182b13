"""No import cycle among Steward's modules, lazy imports included: a module's imports say
what it stands on, and a cycle means two modules that cannot be read (or changed) apart.
A package's `__init__` counts as importing what it re-exports, so a package whose parts
import it back is a cycle too."""

import ast

import pytest

from tests.test_layers import module_name, sources


def imported(me: str, source: str, known: set[str]) -> set[str]:
    """The Steward modules `me` imports: `from a.b import c` is the module `a.b.c` if there
    is one, else `a.b`; a relative import is resolved against `me`'s package."""
    package = me.split(".") if me + ".__init__" in known else me.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[:len(package) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != me:
                found.add(name)
    return found


def graph(files: dict[str, str] | None = None) -> dict[str, set[str]]:
    """module -> the Steward modules it imports, lazy imports included."""
    if files is None:
        paths = sources()
        files = {module_name(p): p.read_text() for p in paths}
        packages = {module_name(p) + ".__init__" for p in paths if p.name == "__init__.py"}
    else:
        packages = {m + ".__init__" for m in files if any(o.startswith(m + ".") for o in files)}
    known = set(files) | packages
    return {me: imported(me, source, known) - packages for me, source in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_back():
    assert cycles(graph()) == []


@pytest.mark.parametrize("files, expected", [
    ({"bot.a": "from bot import b", "bot.b": "def f():\n    import bot.a"}, [["bot.a", "bot.b"]]),
    ({"bot.a": "from bot.b import x", "bot.b": "x = 1"}, []),
    ({"bot.p": "from bot.p.q import f", "bot.p.q": "from bot.p import g"}, [["bot.p", "bot.p.q"]]),
])
def test_a_cycle_is_found_even_through_a_lazy_import(files, expected):
    assert cycles(graph(files)) == expected
