"""Configuration is package data: what the library reads ships in clfjudge/configs and loads through
importlib.resources, whatever the working directory (.ci/wheel_check proves it on an installed wheel)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest

import clfjudge
from clfjudge.configs import config_path
from clfjudge.paths import REPO_ROOT
from clfjudge.training.config import TrainConfig, resolve_deepspeed

CONFIGS = Path(str(resources.files("clfjudge.configs")))
BUNDLED = ("parity.yaml", "int8.yaml", "ds_zero2.json", "recipes/main-smollm2.yaml", "recipes/main-smollm2-pool.yaml")


def test_configs_load_from_the_package_in_any_working_directory(tmp_path):
    """A fresh interpreter in an empty directory: every default points into the package and loads."""
    code = """
        import json
        from importlib import resources
        from pathlib import Path
        from clfjudge.export.parity import PARITY_CONFIG, ParityConfig
        from clfjudge.export.quantize import INT8_CONFIG, int8_settings
        from clfjudge.pipeline import DEFAULT_RECIPE
        from clfjudge.training.config import TrainConfig
        from clfjudge.configs import config_path

        package = Path(str(resources.files("clfjudge.configs")))
        assert {p.parent for p in (PARITY_CONFIG, INT8_CONFIG)} == {package}, (PARITY_CONFIG, INT8_CONFIG)
        assert DEFAULT_RECIPE.parent == package / "recipes", DEFAULT_RECIPE
        parity = ParityConfig.load()
        assert {"fp32", "int8"} <= set(parity.thresholds)
        for isa in ("avx512_vnni", "avx512", "avx2", "arm64"):
            int8_settings(isa)
        assert TrainConfig.from_yaml(DEFAULT_RECIPE).backbone == "smollm2"
        TrainConfig.from_yaml(config_path("recipes/main-smollm2-pool.yaml"))
        assert json.loads(config_path("ds_zero2.json").read_text())["zero_optimization"]["stage"] == 2
        print(package)
    """
    env = {**os.environ, "PYTHONPATH": str(Path(clfjudge.__file__).parents[1])}  # this checkout, not an install
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert Path(run.stdout.strip()) == CONFIGS


def test_pyproject_ships_every_bundled_file():
    """The package-data globs of pyproject.toml cover every file in clfjudge/configs (the wheel gets no other)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = {p for pattern in setuptools["package-data"]["clfjudge.configs"] for p in CONFIGS.glob(pattern)}
    files = {p for p in CONFIGS.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")}
    assert files == shipped
    assert {str(p.relative_to(CONFIGS)) for p in files} >= set(BUNDLED)


def test_a_missing_bundled_file_is_named():
    with pytest.raises(FileNotFoundError, match="nope.yaml is not in clfjudge's package data"):
        config_path("nope.yaml")


def test_deepspeed_config_bundled_by_default_user_paths_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig(backbone="minilm", sources=["pandalm-test"], deepspeed="force")
    assert resolve_deepspeed(cfg, cuda=False) == str(CONFIGS / "ds_zero2.json")
    (tmp_path / "mine.json").write_text("{}")
    assert resolve_deepspeed(replace(cfg, deepspeed_config="mine.json"), cuda=False) == "mine.json"
    with pytest.raises(FileNotFoundError, match="leave it unset"):  # the old default's path is gone
        resolve_deepspeed(replace(cfg, deepspeed_config="train/ds_zero2.json"), cuda=False)
