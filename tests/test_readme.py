"""The README's commands run as written: every `clfjudge` command in its fenced bash blocks and its table of
commands parses, and each sub-command's --help runs; `make` targets exist. Every docs/FILE.md#anchor that the
package, the presets, the README and the docs cite names a heading that exists."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from clfjudge.cli import build_parser, main
from clfjudge.models import offline_weights
from clfjudge.models.offline_weights import (
    OFFLINE_WEIGHTS,
    BuiltWeights,
    InPlaceWeights,
    MissingPackageError,
    PackageFile,
    SetupResult,
)

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _bash_commands() -> list[list[str]]:
    blocks = re.findall(r"^```bash\n(.*?)^```", README, flags=re.M | re.S)
    return [shlex.split(line.split("#", 1)[0]) for block in blocks for line in block.splitlines()
            if line.split("#", 1)[0].strip()]


def _table_commands() -> list[list[str]]:
    return [shlex.split(cell) for cell in re.findall(r"^\| `(clfjudge [^`]*)` \|", README, flags=re.M)]


def _subcommand(argv: list[str]) -> list[str]:
    """`clfjudge data stats --json` -> [data, stats]: the command and, for commands with their own, the action."""
    nested = {"data", "models"}
    return argv[1:3] if argv[1] in nested else argv[1:2]


def test_the_readme_names_commands_that_exist():
    commands = _bash_commands()
    assert [a for a in commands if a[0] == "make"] == [["make", "main"], ["make", "test"]]
    makefile = (REPO / "Makefile").read_text()
    optional = (REPO / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1].split("\n[")[0]
    extras = re.findall(r"^([\w-]+) = \[", optional, flags=re.M)
    for argv in commands:
        assert argv[0] in ("make", "clfjudge", "pip"), argv
        if argv[0] == "make":
            assert re.search(rf"^{argv[1]}:", makefile, flags=re.M), argv
        for arg in argv[2:] if argv[0] == "pip" else ():  # the package's extras and files exist
            if arg.startswith(".["):
                assert set(arg[2:-1].split(",")) <= set(extras), arg
            elif not arg.startswith("-") and "==" not in arg and "://" not in arg:
                assert (REPO / arg).is_file(), arg
    assert len([a for a in commands if a[0] == "clfjudge"]) >= 5 and len(_table_commands()) >= 8


@pytest.mark.parametrize("argv", sorted({tuple(_subcommand(a)) for a in _bash_commands() + _table_commands()
                                         if a[0] == "clfjudge"}), ids=" ".join)
def test_each_readme_subcommand_explains_itself(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: clfjudge {' '.join(argv)}")


def test_the_readmes_commands_parse_as_written():
    parser = build_parser()
    for argv in _bash_commands() + _table_commands():
        if argv[0] == "clfjudge" and "--help" not in argv:
            parser.parse_args(argv[1:])  # an unknown option or a missing argument exits here


def _setup_commands() -> list[list[str]]:
    """Every `clfjudge models setup` the README's code blocks give, on its own line or in a comment beside code."""
    blocks = re.findall(r"^```\w*\n(.*?)^```", README, flags=re.M | re.S)
    return [shlex.split(m) for block in blocks for m in re.findall(r"clfjudge models setup[^&#\n]*", block)]


def test_the_readmes_setup_lines_run_as_written_in_a_fresh_environment(tmp_path, monkeypatch, capsys):
    """No weight package installed: each setup line installs what it needs with this interpreter's pip (stubbed,
    recording the packages as installed) and sets it up (stubbed: the builds are tested in test_offline_weights)."""
    installed: dict[str, str] = {}
    pinned = {s.package: s.version for _, w in OFFLINE_WEIGHTS.items() for s in w.sources}

    def locate(spec: PackageFile) -> Path:
        if installed.get(spec.package) != spec.version:
            raise MissingPackageError(f"package {spec.package} is not installed")
        return tmp_path / spec.path

    def pip(argv: list[str], check: bool = False) -> subprocess.CompletedProcess:
        assert argv[:5] == [sys.executable, "-m", "pip", "install", "--no-deps"], argv
        for pin in argv[5:]:
            name, version = pin.split("==")
            assert pinned[name] == version, pin
            installed[name] = version
        commands.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    def ensure(weights, root=None, *, verify=False) -> SetupResult:
        assert weights.is_installed()
        ready.append(weights.alias)
        return SetupResult(weights.alias, tmp_path / weights.alias, "built", {}, 0.0)

    commands: list[list[str]] = []
    ready: list[str] = []
    monkeypatch.setattr(PackageFile, "locate", locate)
    monkeypatch.setattr(offline_weights.subprocess, "run", pip)
    for kind in (BuiltWeights, InPlaceWeights):
        monkeypatch.setattr(kind, "ensure", ensure)
    setup_lines = _setup_commands()
    assert ["clfjudge", "models", "setup"] in setup_lines and len(setup_lines) >= 2
    for argv in setup_lines:
        assert main(argv[1:]) == 0, argv
    defaults = [alias for alias, w in OFFLINE_WEIGHTS.items() if not w.optional]
    named = [argv[argv.index("--only") + 1] for argv in setup_lines if "--only" in argv]
    assert sorted(ready) == sorted(defaults + named)
    # one pip command per alias, naming every package it needs
    assert sorted(len(c) - 5 for c in commands) == sorted(len(OFFLINE_WEIGHTS.get(a).sources) for a in ready)
    assert "qwen-coder-1.5b" in named and len(OFFLINE_WEIGHTS.get("qwen-coder-1.5b").sources) == 22
    assert "not installed" not in capsys.readouterr().err


def test_the_readme_is_a_landing_page():
    assert len(README.splitlines()) <= 150
    assert not re.search(r"\bissue \d|previous default|session", README, flags=re.I)


def _slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_every_cited_doc_section_exists():
    files = [*REPO.glob("clfjudge/**/*.py"), *REPO.glob("clfjudge/**/*.yaml"), *REPO.glob("export/*"),
             REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("train/**/*.yaml")]
    cited = {(m[0], m[1]) for f in files if f.is_file()
             for m in re.findall(r"docs/([\w-]+\.md)#([\w-]+)", f.read_text(encoding="utf-8"))}
    assert cited
    for doc, anchor in sorted(cited):
        headings = re.findall(r"^#+ (.+)$", (REPO / "docs" / doc).read_text(encoding="utf-8"), flags=re.M)
        assert anchor in {_slug(h) for h in headings}, f"docs/{doc}#{anchor}"
