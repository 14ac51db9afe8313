"""Every kind of export scores from its own directory: a program with onnxruntime, a tokenizer and signature.json
(``standalone_scorer.py``, run in a subprocess that cannot import clfjudge) gives clfjudge's numbers to 1e-6 --
the fine-tuned heads, a released reward model, and the embedding judge whose features (information length, token
statistics, question vectors) and pooling are outside the graph, stated in the signature."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from foreign_models import tiny_reward_model
from test_decoder_embedder import TEMPLATE, _pairs
from tiny_judges import make_judge

from clfjudge.export.onnx import export_judge
from clfjudge.judges.base import Judge
from clfjudge.judges.embedding import EmbeddingModel
from clfjudge.testing import tiny_llama

SCORER = Path(__file__).parent / "standalone_scorer.py"
TOLERANCE = 1e-6
QUESTION = "What is the capital of France?"
ANSWERS = ["  Paris is the capital.  ", "Lyon, because the river runs quickly.",
           "ünïcode: naïve café, 東京 and emoji 🙂"]


def _standalone(directory: Path, items: list[dict], tmp_path: Path) -> list[dict]:
    (tmp_path / "items.json").write_text(json.dumps(items))
    done = subprocess.run([sys.executable, str(SCORER), str(directory), str(tmp_path / "items.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["clfjudge_modules"] == []
    return out["results"]


def _clfjudge(directory: Path, items: list[dict]) -> list[dict]:
    judge = Judge.load(directory)
    out = []
    for item in items:
        if "answer" in item:
            out.append({"score": judge.score(item["question"], item["answer"]).value})
        else:
            c = judge.compare(item["question"], item["answer_a"], item["answer_b"])
            out.append({"p_a": c.p_a, "p_tie": c.p_tie, "p_b": c.p_b})
    return out


def _assert_equal(got: list[dict], expected: list[dict]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.keys() == e.keys()
        for key in e:
            assert g[key] == pytest.approx(e[key], abs=TOLERANCE), (key, g, e)


PAIRS = [{"question": QUESTION, "answer_a": a, "answer_b": b} for a, b in zip(ANSWERS, ANSWERS[1:] + ANSWERS[:1])]
POINTS = [{"question": QUESTION, "answer": a} for a in ANSWERS]


@pytest.fixture(scope="module")
def chat_llama_dir(tmp_path_factory):
    backbone = tiny_llama(tmp_path_factory.mktemp("llama"))
    config = json.loads((backbone / "tokenizer_config.json").read_text())
    (backbone / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return backbone


SEQUENCE_KINDS = {
    "reward-encoder": lambda root, dirs: make_judge(dirs["bert"], root / "src", "reward"),
    "reward-decoder": lambda root, dirs: make_judge(dirs["llama"], root / "src", "reward"),
    "cls3": lambda root, dirs: make_judge(dirs["bert"], root / "src", "cls3"),
    "released-chat-rm": lambda root, dirs: tiny_reward_model("llama", root / "src"),
}


@pytest.mark.parametrize("kind", sorted(SEQUENCE_KINDS))
def test_a_fine_tuned_or_released_export_scores_from_its_files_alone(kind, tiny_bert_dir, tiny_llama_dir, tmp_path):
    source = SEQUENCE_KINDS[kind](tmp_path, {"bert": tiny_bert_dir, "llama": tiny_llama_dir})
    out = export_judge(source, tmp_path / "onnx", n_records=8).out_dir
    items = PAIRS if kind == "cls3" else POINTS
    _assert_equal(_standalone(out, items, tmp_path), _clfjudge(out, items))


@pytest.mark.parametrize("features", [("diff", "info_length_diff"),
                                      ("diff", "token_stats", "length_diff", "cos_diff")],
                         ids=["default", "statistics-and-question"])
def test_an_embedding_judge_export_scores_from_its_files_alone(features, chat_llama_dir, tmp_path):
    options = {"layer": 1, **({"stats_tokens": 4} if "token_stats" in features else {})}
    judge = EmbeddingModel(backbone=str(chat_llama_dir), features=features, use_length=False,
                           head_params={"C": 1.0}, embedder_options=options).fit(_pairs(24))
    source = judge.save(tmp_path / "judge")
    out = export_judge(source, tmp_path / "onnx", n_records=8).out_dir
    signature = json.loads((out / "signature.json").read_text())
    assert "clfjudge" not in json.dumps(signature["postprocessing"])  # stated, not pointed at
    assert [g["name"] for g in signature["postprocessing"]["features"]["groups"]] == list(features)
    items = PAIRS + POINTS  # every group a difference: the judge scores one answer too
    _assert_equal(_standalone(out, items, tmp_path), _clfjudge(out, items))
