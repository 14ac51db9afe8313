"""An exported sequence-classification judge runs without clfjudge: onnxruntime and the tokenizer in the export
directory, driven by its signature.json alone, give the numbers clfjudge gives; the files are readable by other
users (under the usual umask)."""
from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
from foreign_models import tiny_reward_model
from tiny_judges import make_judge

from clfjudge.export.onnx import export_judge
from clfjudge.judges.base import Judge

QUESTION = "What is the capital of France?"
ANSWERS = ["  Paris is the capital.  ", "Lyon, because the river runs quickly."]


def _ids(signature: dict, tokenizer, **fields) -> dict[str, np.ndarray]:
    """Token ids as the signature's pre-processing says, for one sequence."""
    pre = signature["preprocessing"]
    reading = "text" if pre["input"] == "trl" else pre["input"]  # a plain-text question: TRL's standard path
    if reading == "chat-template":
        text = tokenizer.apply_chat_template([{"role": "user", "content": fields["question"]},
                                              {"role": "assistant", "content": fields["answer"]}], tokenize=False)
        enc = tokenizer(text, add_special_tokens=False)
    elif reading == "text":
        enc = tokenizer(fields["question"] + fields["answer"], add_special_tokens=False)
    elif reading == "text-pair":
        enc = tokenizer(fields["question"], fields["answer"])
    else:
        text = pre["template"]
        for name, value in fields.items():
            text = text.replace("{" + name + "}", value)
        enc = tokenizer(text, add_special_tokens=pre["add_special_tokens"])
    return {k: np.asarray([enc[k]], dtype=np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")
            if k in enc}


def _run(directory, signature, **fields) -> np.ndarray:
    import onnxruntime as ort
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    graph = signature["graphs"][signature["primary"]]
    session = ort.InferenceSession(str(directory / signature["primary"]), providers=["CPUExecutionProvider"])
    feed = _ids(signature, tokenizer, **fields)
    return session.run([graph["outputs"][0]["name"]], {i["name"]: feed[i["name"]] for i in graph["inputs"]})[0][0]


@pytest.fixture(scope="module")
def exports(tiny_bert_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    old = os.umask(0o022)
    try:
        return {name: export_judge(src, root / name, n_records=16).out_dir for name, src in {
            "foreign-llama": tiny_reward_model("llama", root / "src-llama"),
            "cls3": make_judge(tiny_bert_dir, root / "src-cls3", "cls3"),
            "reward": make_judge(tiny_bert_dir, root / "src-reward", "reward")}.items()}
    finally:
        os.umask(old)


@pytest.mark.parametrize("name", ["foreign-llama", "reward"])
def test_a_reward_export_scores_from_its_signature_alone(exports, name):
    directory = exports[name]
    signature = json.loads((directory / "signature.json").read_text())
    assert signature["postprocessing"]["columns"] == [signature["graphs"]["model.onnx"]["outputs"][0]["columns"][0]]
    judge = Judge.load(directory)
    for answer in ANSWERS:
        reward = float(_run(directory, signature, question=QUESTION, answer=answer)[0])
        assert reward == pytest.approx(judge.score(QUESTION, answer).value, abs=1e-5)
    if name == "reward":  # a clfjudge judge's own prompt travels as the tokenizer's chat template too
        assert signature["preprocessing"]["chat_template"] is True
        signature["preprocessing"]["input"] = "chat-template"
        assert float(_run(directory, signature, question=QUESTION, answer=ANSWERS[0])[0]) == pytest.approx(
            judge.score(QUESTION, ANSWERS[0]).value, abs=1e-5)


def test_a_pairwise_export_names_its_class_order(exports):
    directory = exports["cls3"]
    signature = json.loads((directory / "signature.json").read_text())
    post = signature["postprocessing"]
    assert post["columns"] == ["TIE", "A", "B"] and signature["preprocessing"]["input"] == "scheme"
    logits = _run(directory, signature, question=QUESTION, answer_a=ANSWERS[0], answer_b=ANSWERS[1])
    z = logits / post["temperature"]
    p = dict(zip(post["columns"], np.exp(z - z.max()) / np.exp(z - z.max()).sum()))
    got = Judge.load(directory).compare(QUESTION, *ANSWERS)
    assert (p["A"], p["TIE"], p["B"]) == pytest.approx((got.p_a, got.p_tie, got.p_b), abs=1e-5)


def test_exported_files_are_readable_by_other_users(exports):
    for directory in exports.values():
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}
        assert set(modes.values()) == {0o644}, modes
        assert {"model.onnx", "config.json", "tokenizer.json", "signature.json", "judge_card.json"} <= set(modes)
