"""The ZeRO-2 path (clfjudge/configs/ds_zero2.json) on CPU: one process under torchrun with DeepSpeed's CPU
accelerator.

The first run JIT-builds DeepSpeed's CPU ops (a few minutes); they are cached in <repo>/.cache."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from clfjudge.card import JudgeCard
from clfjudge.paths import REPO_ROOT, data_root

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (data_root() / "pandalm" / "data" / "testset-v1.json").exists(),
                       reason="needs ../shared/data (present in CI)"),
]


def test_zero2_on_cpu_under_torchrun(tiny_bert_dir, tmp_path):
    recipe = tmp_path / "zero2.yaml"
    out = tmp_path / "judge"
    recipe.write_text(f"backbone: {tiny_bert_dir}\nhead: cls3\nsources: [pandalm-test:32]\nmax_length: 128\n"
                      f"batch_size: 4\nmax_steps: 3\nlogging_steps: 1\ndev_fraction: 0.25\n"
                      f"early_stopping_patience: 0\noutput_dir: {out}\n")
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": "29533"}
    run = subprocess.run(["bash", str(REPO_ROOT / "train" / "launch_cpu_zero2.sh"), str(recipe)], env=env,
                         capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stderr[-3000:]
    card = JudgeCard.load(out)
    assert card.training["deepspeed"], "the run did not go through DeepSpeed"
    assert math.isfinite(card.training["train_loss"])
    assert card.training["global_steps"] == 3
