"""Every judge kind reads only inside its directory: each test plants one file that resolves outside (a link to
another model's weights, to /etc/passwd, a path in a card or configuration, ONNX external data elsewhere) in each
kind it applies to -- a fine-tuned judge on PyTorch, its ONNX export, an embedding judge, its ONNX export and a
reward model without a card -- and finds the judge refused at load with the file named. A judge that cannot load
or score is a judge error: `clfjudge score` exits 3 naming it before reading a line, `clfjudge serve` never starts."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from foreign_models import tiny_reward_model
from test_decoder_embedder import TEMPLATE, _pairs
from tiny_judges import make_judge

from clfjudge.data.records import RecordError
from clfjudge.judges.base import Judge, JudgeError, load_ready
from clfjudge.testing import tiny_llama

SECRET = "/etc/passwd"
KINDS = ("torch", "onnx", "embedding", "embedding-onnx", "foreign")


@pytest.fixture(scope="module")
def judges(tiny_bert_dir, tmp_path_factory) -> dict[str, Path]:
    """One directory of each judge kind, each loadable as it is."""
    from clfjudge.export.onnx import export_judge
    from clfjudge.judges.embedding import EmbeddingModel

    root = tmp_path_factory.mktemp("kinds")
    torch_dir = make_judge(tiny_bert_dir, root / "torch", "cls3")
    chat_llama = tiny_llama(root / "llama")
    config = json.loads((chat_llama / "tokenizer_config.json").read_text())
    (chat_llama / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    embedding = EmbeddingModel(backbone=str(chat_llama), features=("diff",), head_params={"C": 1.0},
                               embedder_options={"layer": 1}).fit(_pairs(12)).save(root / "embedding")
    return {"torch": torch_dir, "onnx": export_judge(torch_dir, root / "onnx", n_records=4).out_dir,
            "embedding": embedding,
            "embedding-onnx": export_judge(embedding, root / "embedding-onnx", n_records=4).out_dir,
            "foreign": tiny_reward_model("bert", root / "foreign")}


@pytest.fixture()
def copy(judges, tmp_path):
    """A fresh copy of a kind's directory, deep inside tmp_path (so '../..' paths stay in the test's tree)."""
    def make(kind: str) -> Path:
        out = tmp_path / "a" / "b" / kind
        shutil.copytree(judges[kind], out)
        return out
    return make


def _link(directory: Path, name: str, target: Path | str) -> None:
    (directory / name).unlink()
    (directory / name).symlink_to(target)


def _outside(directory: Path, name: str) -> Path:
    """A copy of a file of the directory, outside it (the same bytes: only where it lies is wrong)."""
    out = directory.parent / f"stolen-{name}"
    shutil.copy(directory / name, out)
    return out


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _external_data_outside(onnx_file: Path) -> None:
    """Point one initializer of an ONNX file at data outside its directory."""
    import onnx
    from onnx.external_data_helper import set_external_data, uses_external_data

    model = onnx.load(str(onnx_file), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.dims)
    if uses_external_data(tensor):  # already external (the reader's shared weights): only where it lies changes
        next(e for e in tensor.external_data if e.key == "location").value = "../../secret.bin"
    else:
        set_external_data(tensor, location="../../secret.bin")
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
    onnx.save(model, str(onnx_file))
    (onnx_file.parents[2] / "secret.bin").write_bytes(bytes(1 << 16))


def _set_runtime(directory: Path, **fields) -> None:
    def edit(card):
        for dotted, value in fields.items():
            *parents, leaf = dotted.split("__")
            node = card["runtime"]
            for key in parents:
                node = node[key]
            node[leaf] = value
    _edit_json(directory / "judge_card.json", edit)


# (kind, what is planted) -> (plant(directory), the file the error names)
WEIGHTS = {"torch": "model.safetensors", "foreign": "model.safetensors", "onnx": "model.onnx",
           "embedding": "head.safetensors", "embedding-onnx": "reader.onnx"}
CASES = {
    **{(kind, "weights linked to another copy"): (lambda d, n=name: _link(d, n, _outside(d, n)), name)
       for kind, name in WEIGHTS.items()},
    **{(kind, "tokenizer.json linked to a secret"): (lambda d: _link(d, "tokenizer.json", SECRET), "tokenizer.json")
       for kind in ("torch", "onnx", "embedding-onnx", "foreign")},
    **{(kind, "head linked to a secret"): (lambda d: _link(d, "head.safetensors", SECRET), "head.safetensors")
       for kind in ("embedding", "embedding-onnx")},
    **{(kind, "a configuration naming a secret"): (
        lambda d: _edit_json(d / "tokenizer_config.json", lambda c: c.update(tokenizer_file="../../../etc/passwd")),
        "tokenizer_config.json") for kind in ("torch", "onnx", "foreign")},
    ("onnx", "a card naming a secret"): (lambda d: _set_runtime(d, onnx__primary="../../../../etc/passwd"),
                                         "judge_card.json"),
    ("embedding", "a card naming a secret"): (lambda d: _set_runtime(d, sklearn_model="../../../../etc/passwd"),
                                              "judge_card.json"),
    ("embedding-onnx", "a card naming a secret"): (lambda d: _set_runtime(d, reader__primary="../../../etc/passwd"),
                                                   "judge_card.json"),
    ("onnx", "external data outside"): (lambda d: _external_data_outside(d / "model.onnx"), "model.onnx"),
    ("embedding-onnx", "external data outside"): (lambda d: _external_data_outside(d / "reader.onnx"),
                                                  "reader.onnx"),
    **{(kind, "judge_card.json linked to a secret"): (lambda d: _link(d, "judge_card.json", SECRET),
                                                      "judge_card.json")
       for kind in ("torch", "onnx", "embedding", "embedding-onnx")},
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_loads_and_scores_as_it_is(copy, kind):
    assert load_ready(copy(kind)).tasks


@pytest.mark.parametrize("kind, case", sorted(CASES), ids=[f"{k}: {c}" for k, c in sorted(CASES)])
def test_a_file_outside_the_directory_is_refused_naming_it(copy, kind, case):
    directory = copy(kind)
    plant, named = CASES[kind, case]
    plant(directory)
    with pytest.raises(JudgeError) as refused:
        load_ready(directory)
    message = str(refused.value)
    assert f"judge {directory} cannot be used" in message and named in message
    assert "outside" in message or "not a file name inside" in message or "must be a file name" in message


@pytest.mark.parametrize("kind", ["torch", "foreign"])
def test_a_deep_or_huge_tokenizer_json_is_refused_before_it_is_parsed(copy, kind, monkeypatch):
    from clfjudge import untrusted

    directory = copy(kind)
    tokenizer = (directory / "tokenizer.json").read_bytes()
    (directory / "tokenizer.json").write_text('{"a": ' * 5000 + "1" + "}" * 5000)
    with pytest.raises(RecordError, match=r"tokenizer.json.*(nested deeper|not a readable)"):
        Judge.load(directory)
    (directory / "tokenizer.json").write_bytes(tokenizer)
    monkeypatch.setitem(untrusted.MAX_JSON_BYTES_OF, "tokenizer.json", 1000)
    with pytest.raises(RecordError, match="tokenizer.json.*more than the 1000 a tokenizer.json file may have"):
        Judge.load(directory)


def test_a_hub_snapshot_may_link_into_its_own_blob_store_only(judges, tmp_path):
    """The Hugging Face cache: snapshots/REV/NAME -> ../../blobs/HASH, as huggingface_hub lays it out."""
    import hashlib

    repo = tmp_path / "hub" / "models--someone--rm"
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in sorted(judges["foreign"].iterdir()):
        blob = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, repo / "blobs" / blob)
        (snapshot / f.name).symlink_to(Path("../../blobs") / blob)
    assert load_ready(snapshot).tasks
    other = tmp_path / "hub" / "models--someone--else" / "blobs"
    other.mkdir(parents=True)
    (other / "weights").write_bytes((snapshot / "model.safetensors").read_bytes())
    _link(snapshot, "model.safetensors", Path("../../../models--someone--else/blobs/weights"))
    with pytest.raises(ValueError, match="'model.safetensors' points outside"):
        Judge.load(snapshot)


# -- a broken judge is the judge's error ------------------------------------------------------------------------

@pytest.fixture()
def broken_export(copy):
    """An exported embedding judge whose reader's external data lies outside: it loads, and fails when it reads."""
    directory = copy("embedding-onnx")
    _external_data_outside(directory / "reader.onnx")
    return directory


def test_score_with_a_broken_judge_exits_3_before_reading_a_line(broken_export, tmp_path, capsys):
    from clfjudge.cli import EXIT_JUDGE, main

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"id": i, "question": "Q?", "answer_a": "a", "answer_b": "b"}) + "\n"
                             for i in range(3)))
    before = pairs.read_bytes()
    out = tmp_path / "out.jsonl"
    assert main(["score", str(broken_export), "--input", str(pairs), "--output", str(out)]) == EXIT_JUDGE == 3
    err = capsys.readouterr().err
    assert f"clfjudge: error: judge {broken_export} cannot be used" in err and "reader.onnx" in err
    assert "rejected" not in err and not out.exists() and not (tmp_path / "out.jsonl.rejected.jsonl").exists()
    assert pairs.read_bytes() == before


@pytest.mark.parametrize("warm_up", [[], ["--no-warm-up"]])
def test_serve_with_a_broken_judge_exits_3_and_never_listens(broken_export, monkeypatch, capsys, warm_up):
    from clfjudge.cli import main
    from clfjudge.serving import listen

    monkeypatch.setattr(listen, "serve", lambda *a, **kw: pytest.fail("a broken judge was served"))
    assert main(["serve", str(broken_export), "--port", "0", *warm_up]) == 3
    assert f"judge {broken_export} cannot be used" in capsys.readouterr().err


def test_an_app_whose_judge_cannot_score_never_starts(broken_export):
    from starlette.testclient import TestClient

    from clfjudge.serving.server import create_app

    judge = Judge.load(broken_export)  # loads: the reader's session opens on first use
    with pytest.raises(ValueError, match="reader.onnx.*points outside"), TestClient(create_app(judge, warm_up=False)):
        pass


def test_export_of_a_tampered_directory_exits_3(copy, tmp_path, capsys):
    from clfjudge.cli import main

    directory = copy("torch")
    _link(directory, "model.safetensors", _outside(directory, "model.safetensors"))
    assert main(["export", str(directory), "--out", str(tmp_path / "out")]) == 3
    assert "model.safetensors' points outside" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_verdict_judge_holds_a_backbone_inside_it_to_the_same_rule(tmp_path):
    """A verdict judge's card may name its chat model as a folder of the judge directory: that folder's files must
    resolve inside it too, and a relative backbone may not climb out of the judge directory."""
    from clfjudge.judges.verdict import questions_from, verdict_card

    judge = tmp_path / "a" / "verdict"
    model = tiny_llama(judge / "model", chat=True)
    verdict_card("model", questions_from(["correct"], "test"), precision="fp32").save(judge)
    assert load_ready(judge).tasks
    _link(model, "model.safetensors", _outside(model, "model.safetensors"))
    with pytest.raises(JudgeError, match="'model.safetensors' points outside"):
        load_ready(judge)
    shutil.move(model, tmp_path / "model")
    verdict_card("../../model", questions_from(["correct"], "test"), precision="fp32").save(judge)
    with pytest.raises(JudgeError, match="field 'backbone': '../../model' points outside"):
        load_ready(judge)
