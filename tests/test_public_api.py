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


def _help(parser, command: str) -> str:
    for action in parser._subparsers._group_actions:
        if command in action.choices:
            return action.choices[command].format_help()
    raise AssertionError(command)


def test_the_cli_says_what_clfjudge_does_and_names_each_thing_once():
    """`clfjudge --help` speaks to a user; every command that takes a judge directory calls it JUDGE_DIR; `score`
    and `serve` size a judge call with the same --batch-size."""
    from clfjudge.cli import build_parser

    parser = build_parser()
    top = parser.format_help()
    assert "trains classifier judges" in top and "clfjudge/cli/" not in top
    for command in ("export", "score", "calibrate", "serve"):
        assert "JUDGE_DIR" in _help(parser, command), command
        assert "MODEL" not in _help(parser, command), command
    for command in ("score", "serve"):
        assert "--batch-size BATCH_SIZE" in _help(parser, command), command
    assert "int8" not in _help(parser, "run")


def test_serve_still_takes_the_old_batch_size_spelling_and_says_which_to_use(capsys):
    from clfjudge.cli import build_parser

    parser = build_parser()
    assert "--max-batch-size" not in _help(parser, "serve")  # hidden: one name in --help
    args = parser.parse_args(["serve", "judge", "--max-batch-size", "4"])
    assert args.batch_size == 4
    assert "--max-batch-size is deprecated, use --batch-size" in capsys.readouterr().err
    assert parser.parse_args(["serve", "judge"]).batch_size == 32
    assert parser.parse_args(["serve", "judge", "--batch-size", "8"]).batch_size == 8
