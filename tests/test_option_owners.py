"""Options have one owner each: export options ``export.options.ExportOptions``, load options ``options.LoadOptions``
(with the budget's ``batching.Budget``), each built once by whoever exports or loads and handed whole to the
exporter or loader of the judge's kind. No library function re-lists them in its signature (two or more of their
names as parameters), so that a new option is one field and its use where it applies, not a keyword threaded through
every function on the way; every kind's exporter takes ``(judge_dir, out_dir, options)`` and every loader
``(directory, card, options)``."""
import ast
import inspect
from dataclasses import fields
from pathlib import Path

import clfjudge
from clfjudge.export.options import ExportOptions
from clfjudge.kinds import EXPORTERS, LOADERS
from clfjudge.options import LoadOptions

PACKAGE = Path(clfjudge.__file__).parent
EXPORT_OPTIONS = frozenset(f.name for f in fields(ExportOptions))
# LoadOptions' fields and the keywords ``LoadOptions.of`` takes the budget as (``Judge.load``'s keywords)
LOAD_OPTIONS = frozenset({f.name for f in fields(LoadOptions)} | {"batch_size", "max_batch_tokens", "max_padding"})
OWNERS = {"export": PACKAGE / "export" / "options.py", "load": PACKAGE / "options.py"}
# function -> why it may take several load option names
LOAD_ALLOWED = {
    "models/onnx_session.py inference_session": "one runtime session, of a provider already resolved (never 'auto') "
                                                "and its threads; the export's parity gate opens them too",
    "judges/model.py OnnxBackend.__init__": "the same session, behind the fine-tuned judge's backend interface",
    "judges/model.py FineTunedJudge.__init__": "its backend is the runner (TorchBackend / OnnxBackend), not a name",
}


def relisted(source: str, names: frozenset[str]) -> list[tuple[str, int, list[str]]]:
    """(function, line, the option names among its parameters) for every function of ``source`` that takes two or
    more of ``names``; a method is named ``Class.method``."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = child.args
                params = {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
                if len(hit := sorted(params & names)) >= 2:
                    found.append((prefix + getattr(child, "name", "lambda"), child.lineno, hit))
            visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def offenders(names: frozenset[str], owner: Path, allowed: dict[str, str]) -> list[str]:
    return [f"{path.relative_to(PACKAGE.parent)}:{line} {name}({', '.join(hit)})"
            for path in sorted(PACKAGE.rglob("*.py")) if path != owner
            for name, line, hit in relisted(path.read_text(encoding="utf-8"), names)
            if f"{path.relative_to(PACKAGE).as_posix()} {name}" not in allowed]


def test_the_check_finds_a_signature_that_relists_options():
    planted = "def export_x(judge_dir, out_dir, *, int8=False, isa='auto', source=None):\n    pass\n"
    assert relisted(planted, EXPORT_OPTIONS) == [("export_x", 1, ["int8", "isa", "source"])]
    assert relisted("def f(judge_dir, out_dir, options):\n    pass\n", EXPORT_OPTIONS) == []
    assert relisted("def int8_settings(isa='auto', path=None):\n    pass\n", EXPORT_OPTIONS) == []  # one: its own
    reader = "class Reader:\n    def __init__(self, model, *, batch_size=8, budget=None):\n        pass\n"
    assert relisted(reader, LOAD_OPTIONS) == [("Reader.__init__", 2, ["batch_size", "budget"])]
    assert relisted("def _load(directory, card, options):\n    pass\n", LOAD_OPTIONS) == []


def test_no_library_signature_relists_the_export_options():
    found = offenders(EXPORT_OPTIONS, OWNERS["export"], {})
    assert found == [], "export options re-listed (take an ExportOptions instead): " + "; ".join(found)


def test_no_library_signature_relists_the_load_options():
    found = offenders(LOAD_OPTIONS, OWNERS["load"], LOAD_ALLOWED)
    assert found == [], "load options re-listed (take a LoadOptions, or its Budget, instead): " + "; ".join(found)
    sources = {f"{p.relative_to(PACKAGE).as_posix()} {name}" for p in PACKAGE.rglob("*.py")
               for name, _, _ in relisted(p.read_text(encoding="utf-8"), LOAD_OPTIONS)}
    assert set(LOAD_ALLOWED) <= sources, "an allowed signature no longer exists: drop it from LOAD_ALLOWED"


def test_every_kinds_exporter_takes_the_options_whole():
    assert len(EXPORTERS) >= 3
    for kind, exporter in EXPORTERS.items():
        assert list(inspect.signature(exporter).parameters) == ["judge_dir", "out_dir", "options"], kind


def test_every_kinds_loader_takes_the_options_whole_after_the_shared_prologue():
    assert len(LOADERS) >= 7
    for key, loader in LOADERS.items():
        assert list(inspect.signature(loader).parameters) == ["directory", "card", "options"], key
        assert loader.__code__.co_name == "opened", f"{key}: a built-in loader declares its prologue (base.loads)"
