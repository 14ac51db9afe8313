"""The top-level names: resolved on first use, and importing the package loads no heavy library."""
import subprocess
import sys

import pytest


def test_import_is_cheap_and_names_resolve_lazily():
    code = ("import sys, clfjudge; heavy = [m for m in ('torch', 'transformers', 'sklearn', 'onnxruntime') "
            "if m in sys.modules]; assert not heavy, heavy; "
            "from clfjudge import Judge, best_of_n; from clfjudge.judges.base import Judge as J; assert Judge is J; "
            "assert sorted(clfjudge.__all__) == sorted(dir(clfjudge))")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_public_name_resolves_and_unknown_names_fail():
    import clfjudge

    for name in clfjudge.__all__:
        assert getattr(clfjudge, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'Judgee'"):
        clfjudge.Judgee  # noqa: B018
