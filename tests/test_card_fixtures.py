"""Judge directories written by an older clfjudge (tests/fixtures/cards_v2, made by make_cards_v2.py) still load and
judge as they did: a card layout change must come with an upgrade step that reads the older cards."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from clfjudge.card import JudgeCard
from clfjudge.judges.base import Judge
from clfjudge.judges.embedding import embedder_config

FIXTURES = Path(__file__).parent / "fixtures" / "cards_v2"
WRITTEN = json.loads((FIXTURES / "expected.json").read_text())  # the records asked, and the answers then
EXPECTED = WRITTEN["judges"]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A copy of the fixtures laid out as in the repository (the cards name their backbones relative to its root),
    so that loading cannot change the fixtures themselves."""
    root = tmp_path_factory.mktemp("old-cards")
    shutil.copytree(FIXTURES, root / "tests" / "fixtures" / "cards_v2")
    return root


def _same(got: list[dict], want: list[dict]) -> None:
    assert [g.keys() for g in got] == [w.keys() for w in want]
    for g, w in zip(got, want):
        for key, value in w.items():
            if isinstance(value, float):
                np.testing.assert_allclose(g[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
            else:
                assert g[key] == value, key


def test_the_fixtures_are_old_cards():
    """Every fixture's card is in the layout it was written in (not rewritten by a later clfjudge)."""
    cards = sorted(FIXTURES.glob("*/judge_card.json"))
    assert len(cards) == len(EXPECTED) >= 8
    assert {json.loads(c.read_text())["schema_version"] for c in cards} == {2}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_an_old_judge_loads_and_judges_the_same(name, root, monkeypatch):
    monkeypatch.chdir(root)
    judge = Judge.load(Path("tests/fixtures/cards_v2") / name)
    want = EXPECTED[name]
    assert set(want) == {"compare", "score"} & set(judge.tasks)
    if "compare" in want:
        _same([c.to_dict() for c in judge.compare_batch(WRITTEN["pairs"])], want["compare"])
    if "score" in want:
        _same([s.to_dict() for s in judge.score_batch(WRITTEN["points"])], want["score"])


@pytest.mark.parametrize(("name", "embedder"), [("embedding-decoder-pair", "decoder"),
                                                ("embedding-sentence-point", "sentence")])
def test_an_old_embedding_card_names_its_embedder_type_kind_and_reads_as_type(name, embedder):
    card = JudgeCard.load(FIXTURES / name)
    assert card.runtime["embedder"]["kind"] == embedder
    assert embedder_config(card)["type"] == embedder and "kind" not in embedder_config(card)
