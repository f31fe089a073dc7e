"""The import rules of DESIGN.md ("Data flows one way"), checked statically over the source tree.

Every `import` statement counts, wherever it sits (module level, inside a function, under TYPE_CHECKING):
a lazy import is still a dependency. `from package import name` counts as importing the submodule when
`name` is one. Importing a module also runs its parent packages' `__init__`, so the web-side rule follows
imports through the tree (a web module that imports a harmless module which imports the worker is caught).
"""
import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("playground", "inference", "kernels")

# The Django apps of playground/ (each a directory with an apps.py).
APPS = sorted(p.parent.name for p in (ROOT / "playground").glob("*/apps.py"))

# inference/ is the engine: a library any process may load, so it knows nothing of the web stack.
WEB_STACK = {"django", "celery", "kombu", "channels", "channels_redis", "daphne", "playground"}

# What only a GPU worker may load: the engine, its kernels, torch, and the worker side of serving.
WORKER_ONLY = {"torch", "triton", "transformers", "inference", "kernels", "playground.serving.worker"}

# Modules that deliberately run the web side and a worker in one process (the embedded mode and the commands
# that start it); the benchmarks live outside playground (bench/). playground/serving/__init__.py describes the layout.
BOTH_SIDES = {
    "playground.serving.embedded",
    "playground.serving.management.commands.playground",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "__pycache__" not in path.parts:
                found[_module_name(path)] = path
    return found


SOURCES = _sources()


def _imports(module: str, path: Path) -> Iterator[str]:
    """The dotted names `module` imports (relative imports resolved)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                yield submodule if submodule in SOURCES else target


IMPORTS = {module: sorted(set(_imports(module, path))) for module, path in SOURCES.items()}


def _within(name: str, prefixes: set[str] | tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _app(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "playground" and len(parts) > 1 and parts[1] in APPS else None


def _in_tree(name: str) -> str | None:
    """The source module `name` resolves to (itself or the nearest package above it), or None."""
    while name and name not in SOURCES:
        name = name.rpartition(".")[0]
    return name or None


def _loaded_with(module: str) -> list[str]:
    """`module` and the parent packages whose __init__ importing it runs."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in SOURCES]


def test_the_rules_see_every_app_and_resolve_relative_imports():
    assert {"accounts", "api", "chat", "dashboard", "demo", "lab", "serving"} <= set(APPS)
    assert "playground.serving.web.edge" in IMPORTS["playground.serving.web.sampling"]  # `from .edge import ...`
    assert "playground.serving.shared.registry" in IMPORTS["playground.serving.web.dispatch"]  # `from ..shared ...`


def test_django_apps_import_each_other_without_cycles():
    edges: dict[str, dict[str, str]] = {app: {} for app in APPS}  # app -> {app it imports: an example module}
    for module, names in IMPORTS.items():
        source = _app(module)
        for name in names:
            target = _app(name)
            if source and target and target != source:
                edges[source].setdefault(target, module)
    cycles = []
    for start in APPS:  # a path back to `start`, by depth-first search
        stack = [(start, [start])]
        seen = set()
        while stack:
            app, path = stack.pop()
            for target in edges[app]:
                if target == start:
                    cycles.append(path + [start])
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, path + [target]))
    described = {
        " -> ".join(cycle) + "  (" + ", ".join(edges[a][b] for a, b in zip(cycle, cycle[1:])) + ")"
        for cycle in cycles
    }
    assert not described, "Django apps import each other in a cycle:\n" + "\n".join(sorted(described))


def test_the_engine_never_imports_the_web_stack():
    found = [f"{m} imports {n}" for m, names in IMPORTS.items() if _within(m, ("inference",))
             for n in names if _within(n, WEB_STACK)]
    assert not found, "\n".join(found)


def test_kernels_never_import_the_engine_or_the_web_stack():
    found = [f"{m} imports {n}" for m, names in IMPORTS.items() if _within(m, ("kernels",))
             for n in names if _within(n, WEB_STACK | {"inference"})]
    assert not found, "\n".join(found)


def _web_side(module: str) -> bool:
    return _within(module, ("playground",)) and not _within(module, {"playground.serving.worker"} | BOTH_SIDES)


def test_the_web_side_never_loads_the_worker_side_or_torch():
    """Followed through the tree: what a web module imports, and what that imports, and so on."""
    found = []
    for start in filter(_web_side, SOURCES):
        via = {start: [start]}  # module -> the import chain that reached it
        todo = [start]
        while todo:
            module = todo.pop()
            for name in IMPORTS[module]:
                if _within(name, WORKER_ONLY):
                    found.append(" -> ".join(via[module] + [name]))
                    continue
                target = _in_tree(name)
                for loaded in _loaded_with(target) if target else []:
                    if loaded not in via:
                        via[loaded] = via[module] + [loaded]
                        todo.append(loaded)
    assert not found, "the web side loads worker-only code:\n" + "\n".join(sorted(found))
