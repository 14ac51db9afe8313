"""bench/reader_speed.py and research/bigger_readers.py on a tiny random decoder: every reading path runs and
reads the same layer (PyTorch with every layer, cut, exported to ONNX), and the generative judge's rows are
scored from what it wrote."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str):
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def study():
    return load_script(REPO / "research" / "bigger_readers.py", "bigger_readers")


def test_every_reading_path_reads_the_same_layer(tiny_llama_dir, tmp_path):
    paths = ["pytorch fp32 all", "pytorch fp32", "onnx fp32", "onnx int8", "onnx int4"]
    done = subprocess.run([sys.executable, str(REPO / "bench" / "reader_speed.py"), "--reader", str(tiny_llama_dir),
                           "--layer", "1", "--answers", "4", "--repeats", "1", "--threads", "1",
                           "--results", str(tmp_path), "--paths", *paths],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(next(tmp_path.glob("reader_speed_*.json")).read_text())
    rows = result["rows"]
    assert set(rows) == set(paths) and all(r["answers_per_s"] > 0 for r in rows.values())
    # a causal model's layer-1 states do not depend on the layers above: running them changes nothing
    assert rows["pytorch fp32 all"]["min_cosine"] > 0.99999
    assert rows["onnx fp32"]["min_cosine"] > 0.9999
    assert all(0 < rows[p]["min_cosine"] <= 1.00001 for p in ("onnx int8", "onnx int4"))
    assert "| onnx int8 |" in next(tmp_path.glob("reader_speed_*.md")).read_text()


def test_generative_judge_writes_both_orders_and_is_scored(study, tiny_llama_dir, tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "research" / "bigger_readers.py"), "generative", "--model",
                           str(tiny_llama_dir), "--sets", "obvious-pairs", "--pairs", "3", "--cache", str(tmp_path),
                           "--precision", "fp32"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in next((tmp_path / "generative").glob("*.jsonl")).open()]
    assert len(rows) == 3 and all(np.isfinite([r["ab"], r["ba"]]).all() for r in rows)
    scored = study.generative_rows(tmp_path)[tiny_llama_dir.name]["obvious-pairs"]
    expected = np.mean([(r["ab"] - r["ba"] > 0) == (r["gold"] == "A") for r in rows])
    assert scored["pairs"] == 3 and scored["accuracy"] == pytest.approx(100 * expected)


def test_the_bootstrap_of_a_row_against_itself_is_zero_and_a_better_row_is_above(study):
    rng = np.random.default_rng(0)

    class Fake:
        def __init__(self, n):
            self.y = rng.integers(0, 2, n).astype(float)
            self.chars = rng.normal(size=n)

    data = {"pool:a": Fake(200), "llmbar-case-x": Fake(100)}
    a = {n: rng.random(len(p.y)) < 0.6 for n, p in data.items()}
    better = {n: np.ones(len(p.y), bool) for n, p in data.items()}
    assert study.bootstrap(data, a, a, n=200) == (0.0, 0.0)
    low, high = study.bootstrap(data, better, a, n=200)
    assert 0 < low <= high


def test_research_reads_the_reader_through_its_public_names_only():
    import ast

    for path in sorted((REPO / "research").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value.id if isinstance(node.value, ast.Name) else ""
                assert owner in ("self", "cls"), f"{path.name}:{node.lineno}: {ast.unparse(node)} is private"


def test_the_probes_tokenize_as_the_reader_reads(tiny_llama_dir):
    from clfjudge.data.records import PairRecord, Verdict
    from clfjudge.embedders.decoder import DecoderEmbedder

    probe = load_script(REPO / "research" / "reader_probe.py", "reader_probe")
    records = [PairRecord(id="1", question="Name a prime.", answer_a="7", answer_b="9", verdict=Verdict.A),
               PairRecord(id="2", question="Name a prime.", answer_a="9", answer_b="7", verdict=Verdict.B)]
    items, pad = probe.answer_items(str(tiny_llama_dir), records)
    reader = DecoderEmbedder(str(tiny_llama_dir), max_prompt_tokens=probe.MAX_PROMPT,
                             max_answer_tokens=probe.MAX_ANSWER)
    assert pad == reader.eos_id and len(items) == 2  # each distinct answer once
    assert [(p, b) for _, p, b in items] == [(reader.prompt_ids("Name a prime."), reader.answer_ids(a))
                                             for a in ("7", "9")]
    assert items[0][2][-1] == reader.eos_id
