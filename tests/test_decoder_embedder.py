"""The decoder embedder (a frozen causal LM reading each answer after its question) on a tiny random LLaMA,
the embedding judge on top of it, and the judge's C="auto" head."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from clfjudge.batching import Budget
from clfjudge.card import JudgeCard
from clfjudge.data.records import Loc, PairRecord, Verdict
from clfjudge.embedders import make_embedder
from clfjudge.embedders.decoder import DecoderEmbedder, truncate_middle
from clfjudge.embedders.sentence import TextEmbedder
from clfjudge.judges.embedding import AUTO_C_GRID, EmbeddingModel, embedder_for_card
from clfjudge.testing import tiny_llama

LOC = Loc("synthetic.jsonl", 1)
TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant: {% endif %}")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def chat_llama_dir(tmp_path_factory):
    """The tiny LLaMA with a chat template in its tokenizer config."""
    out = tiny_llama(tmp_path_factory.mktemp("chat-llama"))
    config = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return out


def _pairs(n: int, start: int = 0) -> list[PairRecord]:
    """The answer that repeats the question's word wins over an unrelated one; ~6 questions share a word."""
    words = ["apple", "river", "engine", "violin", "planet", "garden"]
    out = []
    for i in range(start, start + n):
        w, other = words[i % 6], words[(i + 3) % 6]
        good, bad = f"The {w} is what you asked about, number {i}.", f"Something on {other} {i}."
        a, b, verdict = (good, bad, "A") if i % 2 else (bad, good, "B")
        out.append(PairRecord.build(LOC, id=f"p{i}", question=f"Question {i} about the {w}?", answer_a=a,
                                    answer_b=b, verdict=verdict, source="synthetic"))
    return out


def test_truncate_middle_keeps_both_ends():
    assert truncate_middle(list(range(5)), 8) == [0, 1, 2, 3, 4]
    assert truncate_middle(list(range(10)), 4) == [0, 1, 8, 9]
    assert truncate_middle(list(range(10)), 5) == [0, 1, 7, 8, 9]


def test_make_embedder_picks_the_type_from_the_backbone_family(llama_dir, tmp_path):
    decoder = make_embedder(str(llama_dir))
    assert isinstance(decoder, DecoderEmbedder)
    assert decoder.config() == {"type": "decoder", "layer": 1, "max_prompt_tokens": 256, "max_answer_tokens": 384,
                                "stats": False}
    assert decoder._model is None  # the layer is resolved from config.json, no weights loaded
    assert isinstance(make_embedder("minilm"), TextEmbedder)
    with pytest.raises(KeyError, match="unknown embedder type 'bag'"):
        make_embedder("minilm", type="bag")
    sentence_folder = tmp_path / "sentence-decoder"  # e.g. EmbeddingGemma: a Gemma3 model type, bidirectional
    shutil.copytree(llama_dir, sentence_folder)
    (sentence_folder / "modules.json").write_text("[]")
    assert isinstance(make_embedder(str(sentence_folder)), TextEmbedder)
    with pytest.raises(ValueError, match="layer 3 out of range: .* has 2 decoder layers"):
        DecoderEmbedder(str(llama_dir), layer=3).config()
    with pytest.raises(ValueError, match="is an encoder .*DecoderEmbedder needs a decoder"):
        DecoderEmbedder("minilm").config()


@pytest.mark.parametrize("fixture", ["llama_dir", "chat_llama_dir"])
def test_answers_are_read_after_their_question(request, fixture, tmp_path):
    path = str(request.getfixturevalue(fixture))
    embedder = DecoderEmbedder(path, layer=2, budget=Budget(3))
    questions = ["What is an apple?", "Where does the river go?", "What is an apple?", "Why?"]
    answers = ["A fruit.", "A fruit.", "A red fruit that grows on trees, often eaten raw or in pies.", ""]
    vectors = embedder.embed_answers(questions, answers)
    assert vectors.shape == (4, 32) and np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(vectors[0], vectors[1])  # same answer, other question: another vector
    # length-sorted right-padded batches give what one-at-a-time gives
    single = DecoderEmbedder(path, layer=2, budget=Budget(1)).embed_answers(questions, answers)
    np.testing.assert_allclose(vectors, single, atol=1e-5)
    # the middle layer differs from the last one, and texts read alone differ from answers read after a question
    assert not np.allclose(DecoderEmbedder(path, layer=1).embed_answers(questions, answers), vectors)
    assert not np.allclose(embedder.embed(answers[:1]), vectors[:1])

    path_npz = embedder.save_cache(tmp_path / "cache.npz")
    fresh = DecoderEmbedder(path, layer=2)
    assert fresh.load_cache(path_npz) == len(embedder) == 5  # four answers, one text read alone
    np.testing.assert_array_equal(fresh.embed_answers(questions[:2], answers[:2]), vectors[:2])
    assert fresh._model is None  # served from the cache
    fresh.clear_cache()
    assert len(fresh) == 0
    with pytest.raises(ValueError, match="embedding cache of encoder .*layer=2.*not .*layer=1"):
        DecoderEmbedder(path, layer=1).load_cache(path_npz)
    with pytest.raises(ValueError, match="2 questions for 1 answers"):
        embedder.embed_answers(questions[:2], answers[:1])


def test_long_prompts_and_answers_are_truncated(llama_dir):
    embedder = DecoderEmbedder(str(llama_dir), max_prompt_tokens=8, max_answer_tokens=5)
    embedder._load()
    long = "word " * 200
    assert len(embedder.prompt_ids(long)) == 8
    assert len(embedder.answer_ids(long)) == 6  # five tokens + EOS
    assert embedder.embed_answers([long], [long]).shape == (1, 32)
    assert "first and last 4 tokens" in embedder.truncation_policy


def test_decoder_embedding_judge_round_trip(llama_dir, tmp_path):
    judge = EmbeddingModel(backbone=str(llama_dir), features=("diff", "abs_diff"), head_params={"C": 1.0},
                           embedder_options={"layer": 1}).fit(_pairs(24))
    test = _pairs(6, start=24)
    proba = judge.predict_proba(test)
    np.testing.assert_allclose(judge.predict_proba([p.swapped() for p in test]), proba[:, ::-1], atol=1e-12)

    judge.save(tmp_path / "judge")
    card = JudgeCard.load(tmp_path / "judge")
    assert card.runtime["embedder"] == {"type": "decoder", "layer": 1, "max_prompt_tokens": 256,
                                        "max_answer_tokens": 384, "stats": False}
    assert "read after their question" in card.truncation["policy"]
    loaded = EmbeddingModel.load(tmp_path / "judge")
    assert isinstance(loaded.embedder, DecoderEmbedder) and loaded.embedder.layer == 1
    np.testing.assert_allclose(loaded.predict_proba(test), proba, atol=1e-6)
    assert embedder_for_card(card, budget=Budget(2)).batch_size == 2
    with pytest.raises(ValueError, match="trained with embedder .*'layer': 1.*the given embedder is .*'layer': 2"):
        EmbeddingModel.load(tmp_path / "judge", embedder=DecoderEmbedder(str(llama_dir), layer=2))


def test_a_given_embedder_is_used_even_while_its_cache_is_empty(llama_dir):
    """An empty embedder is falsy (len 0): the judge must still use it, not build its own."""
    shared = DecoderEmbedder(str(llama_dir))
    judge = EmbeddingModel(backbone=str(llama_dir), features=("diff",), embedder=shared).fit(_pairs(12))
    assert judge.embedder is shared and len(shared) > 0
    with pytest.raises(ValueError, match="either an embedder or embedder_options"):
        EmbeddingModel(backbone=str(llama_dir), embedder=shared, embedder_options={"layer": 1})


def test_auto_c_is_chosen_by_question_grouped_cv(llama_dir):
    embedder = DecoderEmbedder(str(llama_dir))
    judge = EmbeddingModel(backbone=str(llama_dir), features=("diff",), head_params={"C": "auto"},
                           embedder=embedder).fit(_pairs(24))
    assert judge.training_["chosen_C"] in AUTO_C_GRID
    search = judge.fitted_
    # inner folds never split a question: the swapped copy of a pair sits in the same fold as the pair
    for train, test in search.cv:
        assert not set(train % 24) & set(test % 24)
    assert judge.predict(_pairs(2, start=24))[0] in (Verdict.A, Verdict.B, Verdict.TIE)
    with pytest.raises(ValueError, match="C='auto' needs at least 3 distinct training questions"):
        EmbeddingModel(backbone=str(llama_dir), features=("diff",), head_params={"C": "auto"},
                       embedder=embedder).fit(_pairs(2))


def test_token_stats_measure_how_much_the_question_explains_the_answer(chat_llama_dir):
    from clfjudge.embedders.decoder import STAT_NAMES

    path = str(chat_llama_dir)
    embedder = DecoderEmbedder(path, layer=1, stats=True, budget=Budget(2))
    questions = ["What is an apple?", "Where does the river go?", "What is an apple?"]
    answers = ["A fruit.", "To the sea, through many towns and fields.", "A red fruit that grows on trees."]
    stats = embedder.answer_stats(questions, answers)
    assert stats.shape == (3, len(STAT_NAMES)) and np.isfinite(stats).all()
    # the pooled vectors are those of an embedder without statistics (the same layer of the same model)
    np.testing.assert_allclose(embedder.embed_answers(questions, answers),
                               DecoderEmbedder(path, layer=1).embed_answers(questions, answers), atol=1e-5)
    # conditional log-probabilities read the whole sequence at once; unconditional ones reuse one cached prefix:
    # both agree with scoring every token of template + answer from scratch
    embedder._load()
    for q, a, row in zip(questions, answers, stats):
        prompt, body = embedder.prompt_ids(q), embedder.answer_ids(a)
        cond = _log_probs_from_scratch(embedder, prompt, body)
        uncond = _log_probs_from_scratch(embedder, embedder._template(""), body)
        np.testing.assert_allclose(row[STAT_NAMES.index("cond_mean")], cond.mean(), atol=1e-4)
        np.testing.assert_allclose(row[STAT_NAMES.index("uncond_mean")], uncond.mean(), atol=1e-4)
        np.testing.assert_allclose(row[STAT_NAMES.index("pmi_mean")], (cond - uncond).mean(), atol=1e-4)
        np.testing.assert_allclose(row[STAT_NAMES.index("log_tokens")], np.log(len(body)), atol=1e-6)
    with pytest.raises(ValueError, match="needs an embedder built with stats=True"):
        DecoderEmbedder(path).answer_stats(questions, answers)


def _log_probs_from_scratch(embedder, prefix, body):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(embedder.backbone, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prefix + body])).logits[0]
    log_probs = torch.log_softmax(logits[len(prefix) - 1:-1], dim=-1)
    return log_probs.gather(1, torch.tensor(body)[:, None])[:, 0].numpy()


def test_a_judge_on_token_stats_gets_an_embedder_that_computes_them(chat_llama_dir, tmp_path):
    judge = EmbeddingModel(backbone=str(chat_llama_dir), features=("token_stats",), head_params={"C": 1.0},
                           embedder_options={"layer": 1}).fit(_pairs(24))
    assert judge.embedder.stats and judge.training_["n_features"] == 7 + 8  # stats + the two length groups (2 + 6)
    test = _pairs(6, start=24)
    proba = judge.predict_proba(test)
    np.testing.assert_allclose(judge.predict_proba([p.swapped() for p in test]), proba[:, ::-1], atol=1e-12)
    judge.save(tmp_path / "judge")
    assert JudgeCard.load(tmp_path / "judge").runtime["embedder"]["stats"] is True
    np.testing.assert_allclose(EmbeddingModel.load(tmp_path / "judge").predict_proba(test), proba, atol=1e-6)
    with pytest.raises(ValueError, match="must be a decoder embedder with stats=True"):
        EmbeddingModel(backbone=str(chat_llama_dir), features=("token_stats",),
                       embedder=DecoderEmbedder(str(chat_llama_dir)))
    with pytest.raises(ValueError, match="sentence encoder"):
        TextEmbedder().answer_stats(["q"], ["a"])


def test_bf16_reading_agrees_with_fp32(llama_dir):
    questions, answers = ["What is an apple?"] * 2, ["A fruit.", "A red fruit that grows on trees."]
    fp32 = DecoderEmbedder(str(llama_dir), layer=2).embed_answers(questions, answers)
    bf16 = DecoderEmbedder(str(llama_dir), layer=2, precision="bf16")
    assert bf16.precision == "bf16" and "bf16" in bf16.cache_id
    cosine = (fp32 * bf16.embed_answers(questions, answers)).sum(axis=1)
    assert (cosine > 0.99).all()
    with pytest.raises(ValueError, match="precision must be one of"):
        DecoderEmbedder(str(llama_dir), precision="fp8")


def test_disk_cache_serves_a_second_embedder(llama_dir, tmp_path, monkeypatch):
    questions, answers = ["What is an apple?", "Why?"], ["A fruit.", "Because."]
    first = DecoderEmbedder(str(llama_dir), layer=2, cache_dir=tmp_path)
    vectors = first.embed_answers(questions, answers)
    monkeypatch.setenv("CLFJUDGE_EMBEDDING_CACHE", str(tmp_path))
    second = DecoderEmbedder(str(llama_dir), layer=2)  # the environment names the same directory
    np.testing.assert_array_equal(second.embed_answers(questions, answers), vectors)
    assert second._model is None  # nothing was read again
    other = DecoderEmbedder(str(llama_dir), layer=1)  # another identity: its own shard directory
    assert other.embed_answers(questions[:1], answers[:1]).shape == (1, 32) and other._model is not None
    assert len(list(tmp_path.iterdir())) == 2


def test_readings_inside_scratch_are_forgotten_and_never_stored(llama_dir, tmp_path):
    kept = DecoderEmbedder(str(llama_dir), layer=2, cache_dir=tmp_path)
    vectors = kept.embed_answers(["What is an apple?"], ["A fruit."])
    shards = sorted(tmp_path.rglob("shard-*.npz"))
    embedder = DecoderEmbedder(str(llama_dir), layer=2, cache_dir=tmp_path)
    with embedder.scratch():  # the disk cache is loaded first: what it holds stays in memory
        embedder.embed_answers(["Made up?"], ["Made up."])
        assert len(embedder) == 2
    assert len(embedder) == 1 and sorted(tmp_path.rglob("shard-*.npz")) == shards
    np.testing.assert_array_equal(embedder.embed_answers(["What is an apple?"], ["A fruit."]), vectors)
    embedder.embed_answers(["Real?"], ["Real."])  # outside it, readings are stored again
    assert len(sorted(tmp_path.rglob("shard-*.npz"))) == len(shards) + 1


def test_a_sentence_encoder_forgets_what_it_read_inside_scratch(tmp_path):
    encoder = TextEmbedder("minilm", cache_dir=tmp_path)
    with encoder.scratch():
        encoder.embed(["made up"])
    assert len(encoder) == 0 and not list(tmp_path.rglob("shard-*.npz"))
    encoder.embed(["real"])
    assert len(encoder) == 1 and len(list(tmp_path.rglob("shard-*.npz"))) == 1


@pytest.mark.parametrize("stats", [False, True])
def test_answers_sharing_a_prompt_reuse_its_cache_with_the_same_numbers(chat_llama_dir, stats):
    """Best-of-n: eight candidates of one question read after one cached prompt = each read whole."""
    path = str(chat_llama_dir)
    candidates = [f"Candidate {i}: " + "the apple is a fruit " * (i + 1) for i in range(8)]
    questions = ["What is an apple, in one or two sentences?"] * 8
    shared = DecoderEmbedder(path, layer=1, stats=stats, budget=Budget(3))
    whole = DecoderEmbedder(path, layer=1, stats=stats, budget=Budget(3))
    whole.shared_prefix_min = 10 ** 9  # never share
    np.testing.assert_allclose(shared.embed_answers(questions, candidates),
                               whole.embed_answers(questions, candidates), atol=1e-4)
    if stats:
        np.testing.assert_allclose(shared.answer_stats(questions, candidates),
                                   whole.answer_stats(questions, candidates), atol=1e-4)


def test_stats_over_the_first_tokens_are_exact(chat_llama_dir):
    from clfjudge.embedders.decoder import STAT_NAMES

    path = str(chat_llama_dir)
    short = DecoderEmbedder(path, layer=1, stats=True, stats_tokens=3)
    assert short.config()["stats_tokens"] == 3 and "@3" in short.cache_id
    question, answer = "What is an apple?", "A red fruit that grows on trees, often eaten raw or in pies."
    row = short.answer_stats([question], [answer])[0]
    short._load()
    body = short.answer_ids(answer)
    cond = _log_probs_from_scratch(short, short.prompt_ids(question), body)[:3]
    uncond = _log_probs_from_scratch(short, short._template(""), body)[:3]
    np.testing.assert_allclose(row[STAT_NAMES.index("pmi_mean")], (cond - uncond).mean(), atol=1e-4)
    np.testing.assert_allclose(row[STAT_NAMES.index("log_tokens")], np.log(len(body)), atol=1e-6)  # whole answer
    with pytest.raises(ValueError, match="stats_tokens must be a positive"):
        DecoderEmbedder(path, stats=True, stats_tokens=0)


def test_a_loaded_judge_reads_in_the_precision_it_was_trained_with(llama_dir, tmp_path):
    judge = EmbeddingModel(backbone=str(llama_dir), features=("diff",), head_params={"C": 1.0},
                           embedder_options={"layer": 1, "precision": "bf16"}).fit(_pairs(12))
    judge.save(tmp_path / "judge")
    assert JudgeCard.load(tmp_path / "judge").runtime["precision"] == "bf16"
    assert EmbeddingModel.load(tmp_path / "judge").embedder.precision == "bf16"
    assert embedder_for_card(JudgeCard.load(tmp_path / "judge"), precision="fp32").precision == "fp32"


def test_reading_is_stored_block_by_block_keeping_shared_prompts_together(chat_llama_dir, tmp_path):
    """A long read writes each finished block to the disk cache (an interrupted run keeps it); answers of one
    question stay in one block; the rows equal a read in one block."""
    path = str(chat_llama_dir)
    questions = [f"Question {q}: what is fruit number {q}?" for q in range(3) for _ in range(3)]
    answers = [f"Answer {i}: " + "a fruit " * (i + 1) for i in range(9)]
    blocks = DecoderEmbedder(path, layer=1, stats=True, cache_dir=tmp_path)
    blocks.store_every = 2
    calls = []
    read_all = blocks._read_all
    blocks._read_all = lambda items, lp: calls.append([tuple(p) for p, _ in items]) or read_all(items, lp)
    rows = blocks._answers(questions, answers)
    assert len(calls) == 3 and all(len(set(c)) == 1 and len(c) == 3 for c in calls)  # one question per block
    assert len(list(next(tmp_path.iterdir()).iterdir())) >= 3  # one shard per block
    one = DecoderEmbedder(path, layer=1, stats=True)
    np.testing.assert_allclose(rows, one._answers(questions, answers), atol=1e-5)


def test_reading_fixes_the_malloc_mmap_threshold_once():
    """Large freed buffers go back to the system (clfjudge/embedders/memory.py): set on glibc Linux, once, unless the
    user set MALLOC_MMAP_THRESHOLD_ themselves."""
    import subprocess
    import sys

    code = ("import clfjudge.embedders.memory as m, sys; first = m.return_freed_buffers(); "
            "assert m.return_freed_buffers() is False; print(first)")
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == ("True" if sys.platform.startswith("linux") else "False")
    env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "False"
