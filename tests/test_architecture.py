"""Imports run one way (data -> prompts -> models -> embedders -> judges -> training -> export -> serving ->
scoring -> audit -> pipeline -> cli): neither the package's module import graph nor its subpackage graph has a
cycle, counting imports inside functions and under TYPE_CHECKING too. A module that needs one above it names it as a
lazy registry target ("module:attribute", which ``Registry.get`` imports) instead of importing it."""
import ast
import re
from pathlib import Path

import clfjudge

PACKAGE = Path(clfjudge.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its source."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: "." is the module's package, ".." its parent, ...
                    base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                # ``from pkg import mod`` imports the submodule, ``from mod import name`` the module
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a] (depth-first search), or None."""
    state: dict[str, str] = {}

    def visit(path: list[str]) -> list[str] | None:
        state[path[-1]] = "open"
        for dep in sorted(graph[path[-1]]):
            if state.get(dep) == "open":
                return path[path.index(dep):] + [dep]
            if dep not in state and (cycle := visit(path + [dep])):
                return cycle
        state[path[-1]] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit([module])):
            return cycle
    return None


def test_the_graph_sees_every_kind_of_import_and_the_search_finds_cycles():
    graph = import_graph()
    assert "clfjudge.training.data" in graph["clfjudge.training.trainer"]  # top level, relative
    assert "clfjudge.embedders.onnx_reader" in graph["clfjudge.judges.embedding"]  # inside a function
    assert "clfjudge.data.sources" in graph["clfjudge.training.data"]  # ``from . import sources``
    assert "clfjudge.audit.judges" in graph["clfjudge.audit"]  # a package's __init__
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _subpackage(module: str) -> str:
    """clfjudge.data.sources.base -> data; a top-level module is its own unit (clfjudge.metrics -> metrics)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_the_subpackages_import_one_way():
    """data -> prompts -> models -> embedders -> judges -> training -> export -> serving -> scoring -> audit -> cli: no
    subpackage imports one that imports it back (the lazy registry targets excepted, as for modules)."""
    units: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        unit = units.setdefault(_subpackage(module), set())
        unit.update(t for t in map(_subpackage, targets) if t != _subpackage(module))
    for targets in list(units.values()):
        for t in targets:
            units.setdefault(t, set())
    cycle = find_cycle(units)
    assert cycle is None, "subpackage import cycle: " + " -> ".join(cycle)
    assert "judges" in units["training"] and "training" not in units["judges"]


def test_lazy_registry_targets_resolve():
    from clfjudge.export import onnx
    from clfjudge.kinds import EXPORTERS, KINDS, LOADERS, TRAINERS
    from clfjudge.registry import resolve
    from clfjudge.training import config

    # one registration per kind: the subpackages dispatch on the registries clfjudge/kinds.py fills
    assert config.TRAINERS is TRAINERS and onnx.EXPORTERS is EXPORTERS
    for registry in (TRAINERS, EXPORTERS, LOADERS):
        for key, entry in registry.items():  # lazy targets imported by the registry itself
            assert callable(entry) and not isinstance(entry, str), f"{registry.kind} {key!r}"
    for name, kind in KINDS.items():
        assert all(LOADERS.get((name, backend)) is resolve(target) for backend, target in kind.loaders.items()), name
        assert kind.detect is None or callable(resolve(kind.detect)), name


def test_the_judge_kinds_and_the_runtimes_sit_below_every_subpackage():
    """clfjudge/kinds.py names loaders, trainers and exporters lazily and imports none of them; clfjudge/runtimes.py
    names what opens a file on each provider alike."""
    graph = import_graph()
    assert graph["clfjudge.kinds"] == {"clfjudge.registry", "clfjudge.runtimes"}
    assert graph["clfjudge.runtimes"] == {"clfjudge.registry", "clfjudge.machine"}


def test_optional_ray_is_imported_only_by_its_engine():
    """The ray extra is optional: the CLI (every sub-command's parser) and the shared scoring code do not import
    Ray; only scoring/ray_engine.py does, and only the --engine ray paths import it: the CLI's shared engine
    options (``cli/common.py``, for score and audit) and the audit's prediction step (``tests/test_ray_engine.py``
    and ``tests/test_ray_audit.py`` run a single-process score and audit too)."""
    import subprocess
    import sys

    script = ("import sys, clfjudge, clfjudge.scoring.batch, clfjudge.audit\nfrom clfjudge.cli import build_parser\n"
              "build_parser()\n"
              "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]"
    graph = import_graph()
    importers = sorted(m for m, text in _sources().items() if re.search(r"^\s*(import|from) ray\b", text, re.M))
    assert importers == ["clfjudge.scoring.ray_engine"], importers
    assert {m for m, ts in graph.items() if "clfjudge.scoring.ray_engine" in ts} == {"clfjudge.cli.common",
                                                                                     "clfjudge.audit"}


def _sources() -> dict[str, str]:
    return {_module_name(p): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}
