"""Every spelling of a path is the file the OS reaches with it: generated spellings (``..`` through folders that do
not exist yet, ``./``, doubled and trailing slashes, symlinks to a file and to a folder, hard links, relative and
absolute) name where a writer would write exactly as the OS resolves them once the missing folders are made
(``outputs.target``), and every command with an output refuses one aimed at what it reads, with one line and exit
status 2, before it makes a folder or changes a byte."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_judges import make_judge

from clfjudge.cli import EXIT_USAGE, main
from clfjudge.outputs import SamePathError, check_apart, identity, target

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# What may stand before a component: nothing, "." , an empty component (a doubled slash), folders that do not
# exist followed by as many "..", or an existing folder and its "..".
NOISE = st.sampled_from(["", ".", "", "nd/..", "nd/./..", "nd/nd2/../..", "nd/nd2/..//..", "sub/..", "sub/./../."])
ON_DISK = st.sampled_from(["", ".", "sub/..", "sub/./../."])  # an input is read: its spelling goes through folders


@st.composite
def spellings(draw, parts: tuple[str, ...], aliases: dict[str, str] | None = None, trailing: bool = False,
              noise: st.SearchStrategy[str] = NOISE) -> str:
    """A spelling of the path ``parts`` (relative to the layout's root): noise before each component, a component
    swapped for a symlink or hard link to it (``aliases``), a trailing slash where the path is a folder."""
    out = []
    for part in parts:
        out += [draw(noise)]
        alias = (aliases or {}).get(part)
        out.append(alias if alias is not None and draw(st.booleans()) else part)
    text = "/".join(out).lstrip("/") or "."  # relative: an empty first component is no leading slash
    if trailing and draw(st.booleans()):
        text += draw(st.sampled_from(["/", "//", "/."]))
    return text


def _layout(root: Path) -> None:
    """root/data/{in.jsonl, hard.jsonl (hard link), link.jsonl (symlink), sub/}, root/alias -> data, root/sub/."""
    (root / "data" / "sub").mkdir(parents=True)
    (root / "sub").mkdir()
    (root / "data" / "in.jsonl").write_text('{"id": "p0", "question": "Q?", "answer_a": "a", "answer_b": "b"}\n')
    os.link(root / "data" / "in.jsonl", root / "data" / "hard.jsonl")
    (root / "data" / "link.jsonl").symlink_to("in.jsonl")
    (root / "alias").symlink_to("data")


def _snapshot(root: Path) -> dict[str, tuple[str, bytes | str]]:
    return {str(p): ("link", os.readlink(p)) if p.is_symlink() else ("file", p.read_bytes()) if p.is_file()
            else ("dir", "") for p in sorted(root.rglob("*"))}


@contextlib.contextmanager
def _inside(root: Path):
    here = os.getcwd()
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(here)


FILE_ALIASES = {"data": "alias", "in.jsonl": "hard.jsonl"}


@FAST
@given(spelled=spellings(("data", "in.jsonl"), {**FILE_ALIASES}), absolute=st.booleans(),
       through_link=st.booleans())
def test_a_spelling_of_the_input_is_the_input(tmp_path_factory, spelled, absolute, through_link):
    root = tmp_path_factory.mktemp("layout")
    _layout(root)
    if through_link:
        spelled = spelled.rsplit("/", 1)[0] + "/link.jsonl"
    with _inside(root):
        path = f"{root}/{spelled}" if absolute else spelled
        before = _snapshot(root)
        with pytest.raises(SamePathError, match="is the same file as --input"):
            check_apart({"--input": "data/in.jsonl"}, {"--output": path})
        assert identity(path) == identity(root / "data" / "in.jsonl")
        assert os.path.samefile(target(path), root / "data" / "in.jsonl")
        assert _snapshot(root) == before


@FAST
@given(spelled=spellings(("data", "new", "out.jsonl"), {"data": "alias"}), absolute=st.booleans())
def test_the_target_of_a_new_name_is_where_the_os_writes_it(tmp_path_factory, spelled, absolute):
    """Computed before the folders exist, then checked against what the OS made: the same file."""
    root = tmp_path_factory.mktemp("layout")
    _layout(root)
    with _inside(root):
        path = f"{root}/{spelled}" if absolute else spelled
        where, ident = target(path), identity(path)
        check_apart({"--input": "data/in.jsonl"}, {"--output": path})  # not the input
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("new")
        assert os.path.samefile(where, path) and where == root / "data" / "new" / "out.jsonl"
        assert identity(path) != ident or ident[-1] == ()  # the name existed as a file: the same rule either way
        assert identity(path) == identity(where)


# -- every command with an output, through the CLI: refused before anything is made -----------------------------

@pytest.fixture(scope="module")
def judge(tiny_bert_dir, tmp_path_factory) -> Path:
    return make_judge(tiny_bert_dir, tmp_path_factory.mktemp("judge") / "judge")


def _commands(root: Path, judge_dir: Path, spelled_file: str, spelled_dir: str,
              spelled_card: str) -> dict[str, list[str]]:
    """Each command with an output aimed at what it reads: ``spelled_file`` spells data/in.jsonl, ``spelled_dir``
    spells data/ (the folder of an audit's sets named metrics.json, of a recipe named run.json and of a pool named
    pairs.jsonl) or, for export,
    distill and train, the judge's folder (root/judge, a copy); ``spelled_card`` (an input calibrate reads,
    through folders that exist) the judge card calibrate writes."""
    recipe = root / "recipe.yaml"
    judge_spelled = spelled_dir.replace("data", "judge").replace("alias", "jalias")
    return {
        "score --output": ["score", str(judge_dir), "--input", "data/in.jsonl", "--output", spelled_file],
        "score --rejected": ["score", str(judge_dir), "--input", "data/in.jsonl", "--output", "out.jsonl",
                             "--rejected", spelled_file],
        "calibrate --source": ["calibrate", "judge", "--source", spelled_card],
        "audit --out": ["audit", str(judge_dir), "--sets", "data/metrics.json", "--out", spelled_dir],
        "run --out": ["run", "--recipe", "data/run.json", "--out", spelled_dir, "--steps", "data"],
        "export --out": ["export", "judge", "--out", judge_spelled],
        "train output_dir": ["train", "--recipe", str(recipe), "--set", f"output_dir={judge_spelled}"],
        "distill --out": ["distill", "judge", "--pool", "data/in.jsonl", "--recipe", str(recipe), "--out",
                          judge_spelled],
        "label --out": ["label", str(judge_dir), "--pool", "data/pairs.jsonl", "--out", spelled_dir],
    }


@pytest.fixture(scope="module")
def cli_root(judge, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    _layout(root)
    shutil.copytree(judge, root / "judge")
    (root / "jalias").symlink_to("judge")
    (root / "judge" / "sub").mkdir()
    (root / "data" / "metrics.json").write_text(json.dumps([{"question": "Q?", "answer_a": "a", "answer_b": "b",
                                                             "winner": "A"}]))
    (root / "data" / "run.json").write_text("{}\n")
    shutil.copy(root / "data" / "in.jsonl", root / "data" / "pairs.jsonl")  # a pool named as label's chosen pairs
    (root / "recipe.yaml").write_text(f"backbone: {root / 'judge'}\nhead: cls3\nsources: [{root / 'data'}]\n")
    return root


@pytest.mark.parametrize("command", ["score --output", "score --rejected", "calibrate --source", "audit --out",
                                     "run --out", "export --out", "train output_dir", "distill --out",
                                     "label --out"])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spelled_file=spellings(("data", "in.jsonl"), FILE_ALIASES),
       spelled_dir=spellings(("data",), {"data": "alias"}, trailing=True),
       spelled_card=spellings(("judge", "judge_card.json"), {"judge": "jalias"}, noise=ON_DISK))
def test_every_command_refuses_an_output_spelled_as_its_input(cli_root, judge, capsys, command, spelled_file,
                                                              spelled_dir, spelled_card):
    argv = _commands(cli_root, judge, spelled_file, spelled_dir, spelled_card)[command]
    before = _snapshot(cli_root)
    with _inside(cli_root):
        assert main(argv) == EXIT_USAGE, (command, argv)
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "is the same file as" in err and "refused" in err, (argv, err)
    assert _snapshot(cli_root) == before


# -- a new output through folders that do not exist: the writer makes no folder on the way ------------------------

class _Written(Exception):
    """Raised by a stand-in writer once it has made its output, as the command's real writer would."""


def _stand_in(where):
    """A command's writer that makes its output folder as the real ones do (``mkdir(parents=True)`` of the path it
    is given, where a ``missing/..`` makes ``missing``) and stops."""
    def write(*args, **kwargs):
        out = Path(where(*args, **kwargs))
        out.mkdir(parents=True, exist_ok=True)
        (out / "written").write_text("x")
        raise _Written(out)
    return write


# each command that makes an output folder: the function that writes it, and where its output is among its arguments
WRITERS = {
    "train": ("clfjudge.training.trainer.train", lambda cfg: cfg.output_dir),
    "run": ("clfjudge.pipeline.run", lambda config, **_: config.out),
    "distill": ("clfjudge.training.distill.distill", lambda job, config: job.out_dir),
    "label": ("clfjudge.training.labels.label", lambda job, **_: job.out_dir),
    "export": ("clfjudge.export.onnx.export_judge", lambda judge_dir, out, **_: out),
    "audit": ("clfjudge.audit.run_audit", lambda judges, out, **_: out),
}


def _new_output(command: str, root: Path, judge_dir: Path, spelled: str) -> list[str]:
    recipe = str(root / "recipe.yaml")
    return {
        "train": ["train", "--recipe", recipe, "--set", f"output_dir={spelled}"],
        "run": ["run", "--recipe", recipe, "--out", spelled, "--steps", "data"],
        "distill": ["distill", str(judge_dir), "--pool", "data/in.jsonl", "--recipe", recipe, "--out", spelled],
        "label": ["label", str(judge_dir), "--pool", "data/in.jsonl", "--out", spelled],
        "export": ["export", str(judge_dir), "--out", spelled],
        "audit": ["audit", str(judge_dir), "--sets", "data/metrics.json", "--out", spelled],
        "score": ["score", str(judge_dir), "--input", "data/in.jsonl", "--output", f"{spelled}.jsonl"],
    }[command]


@pytest.mark.parametrize("command", [*WRITERS, "score"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spelled=spellings(("fresh",), noise=st.sampled_from(["nd/..", "nd/nd2/../..", "nd/./..", "sub/nd/../.."])))
def test_a_new_output_through_missing_folders_makes_no_folder_on_the_way(cli_root, judge, monkeypatch, command,
                                                                        spelled):
    if command in WRITERS:
        name, where = WRITERS[command]
        module, attribute = name.rsplit(".", 1)
        monkeypatch.setattr(f"{module}.{attribute}", _stand_in(where))
    before = {p.name for p in cli_root.iterdir()} | {p.name for p in (cli_root / "sub").iterdir()}
    try:
        with _inside(cli_root), contextlib.suppress(_Written):
            assert main(_new_output(command, cli_root, judge, spelled)) == 0
        made = ({p.name for p in cli_root.iterdir()} | {p.name for p in (cli_root / "sub").iterdir()}) - before
        assert made == {"fresh.jsonl" if command == "score" else "fresh"}, (spelled, made)
    finally:
        for leftover in ("fresh", "fresh.jsonl", "nd", "sub/nd"):
            path = cli_root / leftover
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
