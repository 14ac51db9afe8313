"""A model directory from someone else is untrusted input: each test plants one hostile thing and checks that
loading refuses it with an error naming the file, and that no code from the directory ran."""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from foreign_models import tiny_reward_model

from clfjudge.card import CARD_NAME, JudgeCard
from clfjudge.data.records import RecordError
from clfjudge.judges.base import Judge
from clfjudge.untrusted import MAX_JSON_BYTES, MAX_JSON_DEPTH

MARKER = "clfjudge-untrusted-test-ran"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_reward_model("bert", tmp_path_factory.mktemp("rm") / "bert")


@pytest.fixture()
def copy(model, tmp_path):
    out = tmp_path / "model"
    shutil.copytree(model, out)
    return out


def _edit(path: Path, **fields) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


class _Payload:
    """Unpickling this runs code (writes the marker file): what a hostile pytorch_model.bin holds."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_a_pickled_checkpoint_that_runs_code_is_refused_and_nothing_runs(copy):
    import torch
    from safetensors.torch import load_file

    state = load_file(copy / "model.safetensors")
    (copy / "model.safetensors").unlink()
    marker = copy.parent / MARKER
    with (copy / "pytorch_model.bin").open("wb") as f:
        pickle.dump({"weights": state, "payload": _Payload(marker)}, f)
    with pytest.raises(Exception, match="(?i)weights_only|unsupported global|weights only"):
        Judge.load(copy)
    assert not marker.exists()
    torch.save(state, copy / "pytorch_model.bin")  # plain tensors: read by torch.load(weights_only=True)
    assert np.isfinite(Judge.load(copy).score("Q?", "A.").value)


def test_a_model_without_safetensors_or_a_checkpoint_is_refused(copy):
    (copy / "model.safetensors").rename(copy / "tf_model.h5")
    with pytest.raises(ValueError, match="no model.safetensors .*found \\['tf_model.h5'\\]"):
        Judge.load(copy)


@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json"])
def test_a_config_naming_custom_code_is_refused(copy, file):
    _edit(copy / file, auto_map={"AutoModelForSequenceClassification": "modeling_evil.EvilModel"})
    (copy / "modeling_evil.py").write_text(f"open({str(copy.parent / MARKER)!r}, 'w')\n")
    with pytest.raises(ValueError, match=f"{file}: field 'auto_map' names custom code.*trust_remote_code is never"):
        Judge.load(copy)
    assert not (copy.parent / MARKER).exists()


def test_files_named_outside_the_directory_are_refused(copy, tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    _edit(copy / "tokenizer_config.json", tokenizer_file="../elsewhere.json")
    with pytest.raises(ValueError, match="tokenizer_config.json field 'tokenizer_file': '../elsewhere.json' points "
                                         "outside"):
        Judge.load(copy)
    _edit(copy / "tokenizer_config.json", tokenizer_file=str(outside))
    with pytest.raises(ValueError, match="is not a file name inside"):
        Judge.load(copy)
    _edit(copy / "tokenizer_config.json", tokenizer_file=None)
    (copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../../stolen.safetensors"}}))
    with pytest.raises(ValueError, match="weight_map.w.*points outside"):
        Judge.load(copy)


@pytest.mark.parametrize("where", ["config.json", CARD_NAME])
def test_huge_or_deeply_nested_configuration_is_refused(copy, where):
    path = copy / where
    if where == CARD_NAME:
        Judge.load(copy).card.save(copy)
    path.write_text('{"a": ' * (MAX_JSON_DEPTH + 5) + "1" + "}" * (MAX_JSON_DEPTH + 5))
    with pytest.raises(RecordError, match=f"{path}.*nested deeper than {MAX_JSON_DEPTH}"):
        Judge.load(copy)
    path.write_text(json.dumps({"padding": "x" * MAX_JSON_BYTES}))
    with pytest.raises(RecordError, match=f"{path}.*bytes, more than the {MAX_JSON_BYTES}"):
        Judge.load(copy)


def test_onnx_external_data_outside_its_directory_is_refused(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import set_external_data

    from clfjudge.judges.model import OnnxBackend

    secret = tmp_path / "secret.bin"
    np.ones((4, 4), np.float32).tofile(secret)
    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["input_ids", "W"], ["logits"])], "g",
                              [helper.make_tensor_value_info("input_ids", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])], [weight])
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
    set_external_data(model.graph.initializer[0], location="../secret.bin")
    model.graph.initializer[0].ClearField("raw_data")
    (tmp_path / "judge").mkdir()
    onnx.save(model, tmp_path / "judge" / "model.onnx")
    with pytest.raises(ValueError, match="tensor 'W' external data: '../secret.bin' points outside"):
        OnnxBackend(tmp_path / "judge" / "model.onnx")
    for entry in model.graph.initializer[0].external_data:  # beside it: read
        if entry.key == "location":
            entry.value = "weights.bin"
    shutil.copy(secret, tmp_path / "judge" / "weights.bin")
    onnx.save(model, tmp_path / "judge" / "model.onnx")
    backend = OnnxBackend(tmp_path / "judge" / "model.onnx")
    assert backend.session.run(None, {"input_ids": np.ones((1, 4), np.float32)})[0].tolist() == [[4.0] * 4]


def test_a_card_naming_onnx_files_outside_is_refused(copy, tmp_path):
    card = Judge.load(copy).card
    card.runtime = {"backend": "onnx", "onnx": {"primary": "../../model.onnx"}}
    card.save(copy)
    with pytest.raises(ValueError, match="points outside"):
        Judge.load(copy)
    assert JudgeCard.load(copy).runtime["onnx"]["primary"] == "../../model.onnx"
