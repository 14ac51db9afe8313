"""Export options have one owner, ``export.options.ExportOptions``: built once by whoever exports and handed whole to
the exporter of the judge's kind. No library function re-lists them in its signature (two or more of their names as
parameters), so that a new option is one field and its use where it applies, not a keyword threaded through every
function on the way; and every kind's exporter takes ``(judge_dir, out_dir, options)``."""
import ast
import inspect
from dataclasses import fields
from pathlib import Path

import clfjudge
from clfjudge.export.options import ExportOptions
from clfjudge.kinds import EXPORTERS

PACKAGE = Path(clfjudge.__file__).parent
EXPORT_OPTIONS = frozenset(f.name for f in fields(ExportOptions))
OWNER = PACKAGE / "export" / "options.py"


def relisted(source: str, names: frozenset[str]) -> list[tuple[str, int, list[str]]]:
    """(function, line, the option names among its parameters) for every function of ``source`` that takes two or
    more of ``names``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            params = {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
            if len(hit := sorted(params & names)) >= 2:
                found.append((getattr(node, "name", "lambda"), node.lineno, hit))
    return found


def test_the_check_finds_a_signature_that_relists_options():
    planted = "def export_x(judge_dir, out_dir, *, int8=False, isa='auto', source=None):\n    pass\n"
    assert relisted(planted, EXPORT_OPTIONS) == [("export_x", 1, ["int8", "isa", "source"])]
    assert relisted("def f(judge_dir, out_dir, options):\n    pass\n", EXPORT_OPTIONS) == []
    assert relisted("def int8_settings(isa='auto', path=None):\n    pass\n", EXPORT_OPTIONS) == []  # one: its own


def test_no_library_signature_relists_the_export_options():
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line} {name}({', '.join(hit)})"
                 for path in sorted(PACKAGE.rglob("*.py")) if path != OWNER
                 for name, line, hit in relisted(path.read_text(encoding="utf-8"), EXPORT_OPTIONS)]
    assert offenders == [], "export options re-listed (take an ExportOptions instead): " + "; ".join(offenders)


def test_every_kinds_exporter_takes_the_options_whole():
    assert len(EXPORTERS) >= 3
    for kind, exporter in EXPORTERS.items():
        assert list(inspect.signature(exporter).parameters) == ["judge_dir", "out_dir", "options"], kind
