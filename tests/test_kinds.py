"""The registries the runtime dispatches on: ``Registry.get`` imports a lazy target itself (once), ``override``
registers for a block; a judge card's kind and its backend (or the kind, from the directory) name the loader,
exported forms and older cards included, with no branch on a kind's name outside clfjudge/kinds.py."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from clfjudge.judges import embedding, generative, model, verdict, verdict_onnx
from clfjudge.kinds import (
    KINDS,
    LOADERS,
    TRAINERS,
    JudgeKind,
    backends,
    find_loader,
    kind_of,
    register_kind,
    registered_kind,
)
from clfjudge.models.heads import HEADS, RewardHead
from clfjudge.registry import Registry


def card(head: str, **runtime) -> SimpleNamespace:
    """A card as a loader reads it, by the name of its head (fine-tuned) or kind (the others)."""
    return SimpleNamespace(kind=kind_of(head), head=head if head in HEADS else "", runtime=runtime)


# -- the registry -----------------------------------------------------------------------------------------

def test_get_imports_a_lazy_target_once_and_items_list_what_get_returns(monkeypatch):
    registry: Registry = Registry("thing")
    registry.register("dumps", "json:dumps")
    registry.register("plain", len)
    original = json.dumps
    assert registry.get("dumps") is original
    monkeypatch.setattr(json, "dumps", lambda obj: "patched")
    assert registry.get("dumps") is original  # memoised: the module is not read again
    assert list(registry.items()) == [("dumps", original), ("plain", len)]
    with pytest.raises(ValueError, match="expected 'package.module:attribute'"):
        registry.register("bad", "json.dumps")  # refused when registered, not at its first use
    with pytest.raises(KeyError, match="unknown thing 'nope'; known: dumps, plain"):
        registry.get("nope")


def test_override_holds_for_its_block_and_restores_what_was_there():
    registry: Registry = Registry("thing")
    registry.register("a", "json:dumps")
    assert registry.get("a") is json.dumps
    with registry.override("a", len), registry.override("b", "json:loads"):
        assert (registry.get("a"), registry.get("b")) == (len, json.loads)
    assert registry.get("a") is json.dumps and "b" not in registry
    with pytest.raises(RuntimeError), registry.override("c", len):
        raise RuntimeError  # restored however the block ends
    assert registry.names() == ["a"]
    registry.unregister("a")
    with pytest.raises(KeyError, match="unknown thing 'a'"):
        registry.unregister("a")


# -- kinds ------------------------------------------------------------------------------------------------

def test_a_head_names_its_kind():
    assert {head: kind_of(head) for head in HEADS.names()} == dict.fromkeys(HEADS.names(), "fine-tuned")
    assert [kind_of(k) for k in ("embedding", "generative", "verdict")] == ["embedding", "generative", "verdict"]
    with pytest.raises(ValueError, match=r"x/judge_card.json field 'head': 'toy' is no registered judge kind"):
        kind_of("toy", "x/judge_card.json")


@pytest.mark.parametrize(("head", "runtime", "files", "backend", "loader"), [
    ("cls3", {}, ["model.safetensors"], "torch", model._load_torch),
    ("reward", {}, ["model.onnx"], "onnx", model._load_onnx),  # an export found in the directory
    ("cls3", {"backend": "onnx", "onnx": {}}, [], "onnx", model._load_onnx),
    ("embedding", {}, [], "sklearn", embedding._load_sklearn),
    ("embedding", {"backend": "onnx", "reader": {}}, [], "onnx", embedding._load_onnx),  # as exports write it
    ("generative", {"backend": "generate"}, [], "generate", generative._load_generate),
    ("verdict", {"backend": "verdict"}, [], "verdict", verdict._load_verdict),
    ("verdict", {"backend": "verdict-onnx", "onnx": {}}, [], "onnx", verdict_onnx._load_verdict_onnx),  # alias
])
def test_the_card_picks_the_loader_of_its_kind_and_backend(tmp_path, head, runtime, files, backend, loader):
    for name in files:
        (tmp_path / name).write_bytes(b"")
    assert find_loader(tmp_path, card(head, **runtime)) == (backend, loader)


def test_every_kind_loads_its_export_with_backend_onnx_and_refuses_what_is_not_its_own(tmp_path):
    for head, loader in [("cls3", model._load_onnx), ("embedding", embedding._load_onnx),
                         ("verdict", verdict_onnx._load_verdict_onnx)]:
        assert find_loader(tmp_path, card(head), "onnx") == ("onnx", loader)
    assert find_loader(tmp_path, card("verdict"), "verdict-onnx")[0] == "onnx"
    with pytest.raises(ValueError, match="backend 'torch' is not a backend of the embedding kind: it loads with "
                                         "sklearn, onnx"):
        find_loader(tmp_path, card("embedding"), "torch")
    with pytest.raises(ValueError, match="judge_card.json field 'runtime.backend' 'torch' is not a backend of the "
                                         "generative kind"):
        find_loader(tmp_path, card("generative", backend="torch"))
    with pytest.raises(ValueError, match="field 'runtime.backend' 'tensorrt' is not a backend"):
        find_loader(tmp_path, card("cls3", backend="tensorrt"))
    with pytest.raises(KeyError, match="unknown judge backend 'tensorrt'; known: generate, onnx, sklearn, torch"):
        find_loader(tmp_path, card("cls3"), "tensorrt")
    with pytest.raises(FileNotFoundError, match="no model found"):
        find_loader(tmp_path, card("cls3"))  # nothing in the directory for the fine-tuned kind to detect
    assert "verdict-onnx" in backends()


def test_a_kind_is_registered_whole_or_not_at_all():
    toy = JudgeKind(loaders={"toy": len}, trainer=len)
    with pytest.raises(ValueError, match="aliases {'old': 'gone'} name no backend of its loaders"):
        register_kind("toy", JudgeKind(loaders={"toy": len}, aliases={"old": "gone"}))
    with registered_kind("toy", toy):
        assert KINDS.get("toy") is toy and LOADERS.get(("toy", "toy")) is len and TRAINERS.get("toy") is len
        with pytest.raises(ValueError, match="judge kind 'toy', judge loader 'toy/toy', trainer 'toy' is registered"):
            register_kind("toy", toy)
    assert "toy" not in KINDS and ("toy", "toy") not in LOADERS and "toy" not in TRAINERS
    with TRAINERS.override("toy", len), pytest.raises(ValueError, match="toy': trainer 'toy' is registered already"):
        register_kind("toy", toy)
    assert "toy" not in KINDS and ("toy", "toy") not in LOADERS  # refused before anything was registered


def test_a_head_says_what_its_judge_can_do():
    assert {name: HEADS.get(name).tasks for name in HEADS.names()} == {
        "cls3": ("compare",), "regression": ("score",), "reward": ("compare", "score"),
        "reward-binary": ("compare", "score")}

    class Point(HEADS.get("regression")):
        pass

    class Graded(RewardHead):
        arity = "point"

    assert Point.tasks == ("score",) and Graded.tasks == ("compare", "score")  # inherited as the head said


def test_loading_branches_on_no_kind_name():
    """Judge.load and the fine-tuned loaders find a kind's loader through the registry alone."""
    for module in ("base", "model"):
        text = (Path(model.__file__).parent / f"{module}.py").read_text(encoding="utf-8")
        assert not any(f"card.{field} {op}" in text for field in ("head", "kind") for op in ("==", "in (")), module


def test_no_module_branches_on_a_head_name():
    """What a head does differently (the names of its outputs included: ``Head.from_labels``) is the head's own."""
    package = Path(model.__file__).parents[1]
    assert not [str(p) for p in package.rglob("*.py") if "head ==" in p.read_text(encoding="utf-8")]
