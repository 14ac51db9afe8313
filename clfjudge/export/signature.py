"""What another runtime needs to use an exported judge without clfjudge: ``signature.json`` beside the ONNX files
(and config.json + the tokenizer files, the layout optimum's ``ORTModelForSequenceClassification`` opens): the
inputs and outputs of every graph with their dtypes and axes, the class order of every output column, the
pooling, how text becomes token ids (pre-processing) and how outputs become rewards, probabilities or scores
(post-processing, with the card's calibration). ``tests/test_export_signature.py`` scores exported judges with
onnxruntime and a tokenizer, reading this file alone.

Exported files are made readable by other users (``publish``: the modes the process's umask allows, as a plain
file write gets; ``umask 077`` keeps them private), since a service account other than the writer reads them.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..card import JudgeCard
from ..data.conversation import FLATTENING

SIGNATURE_NAME = "signature.json"
# 1: the judge as "judge" (a kind or a head) and "kind" (pair / point); 2: as the card names it (``_judge``);
# 3: a decoder reader's "embedder" names its type in "type" (before: "kind")
SIGNATURE_VERSION = 3

_POOLING = {
    "encoder": "the classifier reads the first token's final hidden state ([CLS] / <s>; through the model's pooler "
               "where it has one)",
    "decoder": "the classifier reads the final hidden state of the last token that is not config.pad_token_id "
               "(right padding)",
}


def _judge(card: JudgeCard) -> dict[str, str]:
    """The judge as its card names it: kind, head (a fine-tuned judge's) and arity (pair / point)."""
    return {"kind": card.kind, **({"head": card.head} if card.head else {}), "arity": card.arity}


def graph_io(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Inputs and outputs of an ONNX graph: name, element type and axes (a name for a dynamic axis)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)

    def describe(values) -> list[dict[str, Any]]:
        out = []
        for v in values:
            t = v.type.tensor_type
            out.append({"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name,
                        "shape": [d.dim_param or d.dim_value for d in t.shape.dim]})
        return out

    return {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output)}


def _preprocessing(card: JudgeCard, tokenizer: Any, chat_template: bool) -> dict[str, Any]:
    from ..prompts.chat_template import text_template

    policy = card.truncation.get("policy", {})
    common = {"max_length": card.max_length, "padding_side": "right", "pad_token_id": tokenizer.pad_token_id,
              "truncation": {"policy": policy, "how": "clfjudge cuts a longer input field by field (each field "
                                                      "keeps its head and tail joined by ' … '); an input within "
                                                      "max_length is used as it is"}}
    model_input = card.truncation.get("input")
    if model_input == "chat-template":
        return {"input": "chat-template", "add_special_tokens": False, **common,
                "how": "text = tokenizer.apply_chat_template(messages + [{'role': 'assistant', 'content': answer}], "
                       "tokenize=False), messages the conversation's turns as given (system prompt, earlier turns, "
                       "list content), [{'role': 'user', 'content': question}] for a plain question; ids = "
                       "tokenizer(text, add_special_tokens=False)"}
    if model_input == "trl":
        return {"input": "trl", "add_special_tokens": False, **common,
                "how": "as TRL's GRPOTrainer reads each data shape: a prompt given as messages as 'chat-template' "
                       "reads it (text = tokenizer.apply_chat_template(messages + [{'role': 'assistant', 'content': "
                       "answer}], tokenize=False); ids = tokenizer(text, add_special_tokens=False)), a plain-text "
                       "prompt as 'text' does (ids = tokenizer(question + answer, add_special_tokens=False))"}
    if model_input == "text":
        return {"input": "text", "add_special_tokens": False, **common,
                "how": "ids = tokenizer(question + answer, add_special_tokens=False) (TRL's standard format)"}
    if model_input == "text-pair":
        return {"input": "text-pair", "add_special_tokens": True, **common, "how": "ids = tokenizer(question, answer)"}
    how = ("text = template with each {field} replaced by the record's field (a conversation's question: "
           "conversation: below); ids = tokenizer(text)")
    if chat_template:
        how += ("; equivalently (one answer): text = tokenizer.apply_chat_template(the conversation's messages + "
                "[{'role': 'assistant', 'content': answer}], tokenize=False); ids = tokenizer(text, "
                "add_special_tokens=False)")
    return {"input": "scheme", "scheme": card.scheme, "template": text_template(card.scheme),
            "add_special_tokens": True, "chat_template": chat_template, **common, "how": how,
            "conversation": FLATTENING}


def sequence_classification(card: JudgeCard, config: Any, tokenizer: Any, directory: Path,
                            files: Mapping[str, Mapping[str, Any]], primary: str) -> dict[str, Any]:
    """The signature of a sequence-classification export (``export.fine_tuned``)."""
    from ..models.backbones import family_of
    from ..models.heads import HEADS

    columns = [str(config.id2label[i]) for i in range(config.num_labels)]
    graphs = {name: {**graph_io(directory / name), "precision": meta.get("precision")} for name, meta in files.items()}
    for graph in graphs.values():
        for output in graph["outputs"]:
            output["columns"] = columns
    return {"signature_version": SIGNATURE_VERSION, "task": "sequence-classification", **_judge(card),
            "primary": primary, "graphs": graphs,
            "layout": "optimum ORTModelForSequenceClassification: model.onnx + config.json + tokenizer files",
            "pooling": _POOLING[family_of(config.to_dict())],
            "preprocessing": _preprocessing(card, tokenizer, bool(getattr(tokenizer, "chat_template", None))),
            "postprocessing": {"columns": columns, **HEADS.get(card.head).postprocessing(card, columns)}}


def write(directory: Path, signature: Mapping[str, Any]) -> Path:
    path = directory / SIGNATURE_NAME
    path.write_text(json.dumps(signature, indent=2, sort_keys=False) + "\n")
    return path


def finish(tmp: Path, out: Path, card, signature: Mapping[str, Any] | None = None) -> None:
    """Write the card (and ``signature``) into the staged export ``tmp``, give its files plain modes and move it
    to ``out`` (empty or missing: checked before the export began)."""
    card.save(tmp)
    if signature is not None:
        write(tmp, signature)
    publish(tmp)
    if out.exists():
        out.rmdir()
    os.replace(tmp, out)


def publish(directory: Path) -> None:
    """Give an export directory and its files the modes a plain write gets under the process's umask (files
    0644 and folders 0755 under the usual 022); temporary directories and some writers (safetensors) use 0700 /
    0600, which would hide an export from a service user other than its writer."""
    umask = os.umask(0)
    os.umask(umask)
    for root, dirs, names in os.walk(directory):
        for name in names:
            os.chmod(os.path.join(root, name), 0o666 & ~umask)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~umask)
    os.chmod(directory, 0o777 & ~umask)


def _head(card: JudgeCard, directory: Path) -> dict[str, Any]:
    """The embedding judge's head: a linear head's arrays written out (a reader needs no safetensors), else the
    file and its format."""
    from ..judges.linear_head import LINEAR_FILE, LinearHead

    name = card.runtime["sklearn_model"]
    if name != LINEAR_FILE:
        return {"file": name, "format": card.runtime.get("format"),
                "how": "a scikit-learn estimator (skops): predict_proba(x) in the coding of its classes_"}
    head = LinearHead.load(directory / name)
    arrays = {k: getattr(head, k).tolist() for k in ("mean", "scale", "weights", "coef", "intercept")}
    return {"file": name, "format": "safetensors-linear", **arrays,
            "classes": None if head.classes_ is None else head.classes_.tolist(),
            "logits": "z = ((x - mean) / scale * weights) @ coef.T + intercept (float64)",
            "proba": "one row of coef (binary): P(classes[1]) = sigmoid(z[0]), P(classes[0]) = 1 - P(classes[1]); "
                     "several: softmax(z), column j the probability of classes[j]; a class of the coding "
                     "{0: TIE, 1: A, 2: B} not in classes has probability 0"}


def _features(card: JudgeCard, hidden_size: int) -> dict[str, Any]:
    """The feature groups of an embedding pair judge in column order, each with its width and formula."""
    from ..judges.embedding import NOTATION, PAIR_FEATURES

    groups = [{"name": g, "columns": PAIR_FEATURES.get(g).columns or hidden_size,
               "symmetry": PAIR_FEATURES.get(g).symmetry, "formula": PAIR_FEATURES.get(g).formula}
              for g in card.training["features"]]
    return {"x(Q, A, B)": "the groups' values side by side, in this order (float64)", "groups": groups,
            "notation": NOTATION}


def decoder_reader(card: JudgeCard, directory: Path) -> dict[str, Any]:
    """The signature of an embedding judge's decoder-reader export (``export.embedding``): the graphs read answers
    into vectors; the feature groups (formulas below) and the head (its arrays below) turn two answers' readings
    into probabilities; everything a program needs to score the export without clfjudge."""
    from ..judges.embedding import embedder_config

    reader = card.runtime["reader"]
    embedder = embedder_config(card)
    names = [*reader["files"], reader["shared_prefix"]["prefix"], reader["shared_prefix"]["continuation"]]
    graphs = {name: graph_io(directory / name) for name in names if (directory / name).is_file()}
    before, after = reader["template"]
    limit = embedder.get("max_prompt_tokens")
    cal = card.calibration
    return {
        "signature_version": SIGNATURE_VERSION, "task": "decoder-reader", **_judge(card),
        "primary": card.runtime["onnx"]["primary"], "graphs": graphs,
        "shared_weights": reader.get("shared_weights"),
        "embedder": embedder,  # layer, max_prompt_tokens, max_answer_tokens, stats, stats_tokens
        "pooling": "pooled = sum over t of pool[b, t] * (hidden state of the embedder's layer at t); pool holds "
                   "1 / len(answer_ids) over the answer_ids' positions (the appended EOS included), 0 elsewhere",
        "preprocessing": {
            "tokenizer": "tokenizer.json (the tokenizers library): ids(text) = Tokenizer.encode(text, "
                         "add_special_tokens=False).ids",
            "prompt_ids": f"ids(template[0] + question + template[1]); longer than max_prompt_tokens ({limit}): "
                          "ids[:max_prompt_tokens // 2] + ids[len(ids) - (max_prompt_tokens - max_prompt_tokens "
                          "// 2):]",
            "template": [before, after],
            "answer_ids": "ids(answer)[:max_answer_tokens] + [eos_token_id] (the EOS is part of the answer: read, "
                          "pooled and, with statistics, scored)",
            "eos_token_id": reader["eos_token_id"],
            "input_ids": "prompt_ids + answer_ids, right-padded with eos_token_id; attention_mask 1 over them",
            "positions / targets": "for each of the first stats_tokens answer tokens (all: None): the position whose "
                                   "state predicts it (one before it) and its id",
            "shared prefix": "prefix.onnx reads a prompt once (batch 1) into its key/value cache "
                             "(present.{i}.key / .value); continuation.onnx reads a batch of answers after it "
                             "(past_key_values.{i}.*, attention_mask over cache + answer)",
        },
        "postprocessing": {
            "outputs": "pooled: (batch, hidden) of each answer, before normalisation; log_probs: (batch, span) "
                       "log-probability of each scored answer token",
            "features": _features(card, int(reader["hidden_size"])),
            "head": _head(card, directory),
            "compare": "P_AB = the head's probabilities of x(Q, A, B) in the columns [A, TIE, B], P_BA those of "
                       "x(Q, B, A); P = (P_AB + P_BA reversed) / 2, columns [A, TIE, B]; with a calibration "
                       "temperature T: P = softmax(log(max(P, 1e-12)) / T)",
            "reward": "r(Q, A) = f(Q, A) . (coef_row(A) - coef_row(B)) where f(Q, A) is x's one-answer term of "
                      "every group (v(A), I(A), L(A), s(A), v(Q) * v(A), c(v(Q), v(A)): each difference group "
                      "with its B term dropped) divided by scale and multiplied by weights; coef_row(c) is the row of "
                      "coef for class c, one row (binary): coef[0] for classes[1], zeros for classes[0]; only judges "
                      "whose groups are all differences (symmetry 'anti') score one answer",
            "columns": card.label_map.get("proba_columns"),
            "temperature": cal.get("temperature", 1.0), "tie_margin": cal.get("tie_margin"),
        },
    }


def verdict(card: JudgeCard, reader: Any, directory: Path) -> dict[str, Any]:
    """The signature of a verdict judge's export (``export.verdict``): one graph per question, token ids -> the
    log-odds of the verdict tokens; ``reader`` (the judge's ``VerdictReader``) gives the verdict token ids."""
    from ..judges.verdict import verdict_token_ids

    runtime = card.runtime["onnx"]
    questions = []
    for k, question in enumerate(reader.questions):
        yes, no = verdict_token_ids(reader.tokenizer, question)
        questions.append({"name": question.name, "pairwise": question.pairwise,
                          "graphs": {variant: files[k] for variant, files in runtime["files"].items()},
                          "messages": ([{"role": "system", "content": question.system}] if question.system else [])
                          + [{"role": "user", "content": question.user}],
                          "positive": list(question.positive), "negative": list(question.negative),
                          "positive_token_ids": yes, "negative_token_ids": no})
    primary = runtime["files"][runtime["primary"]]
    shared = runtime.get("shared_prefix") or {}
    # an OpenVINO IR variant (.xml, its weights in the .bin of its name) has the inputs and outputs of its fp32 graph
    graphs = {name: graph_io(directory / name) if not name.endswith(".xml") else
              {**graph_io(directory / primary[k]), "format": "openvino-ir", "weights": name[:-len(".xml")] + ".bin"}
              for files in runtime["files"].values() for k, name in enumerate(files)}
    pointwise = card.arity == "point"
    cal = card.calibration
    return {
        "signature_version": SIGNATURE_VERSION, "task": "verdict", **_judge(card),
        "primary": runtime["primary"], "variants": runtime["files"], "graphs": graphs,
        "shared_weights": runtime.get("shared_weights"), "questions": questions,
        **({"shared_prefix": {
            "variants": shared["variants"], "files": shared["files"], "empty_cache": shared["empty_cache"],
            "graphs": {name: graph_io(directory / name) for name in shared["files"]},
            "how": "answers to one question share their prompt's first tokens (the messages up to the paragraph of "
                   "the first answer placeholder, tokenized with the whole prompt: the prompt's ids as long as they "
                   "agree with that text's ids alone). The question's cached graph reads those ids (batch 1) after an "
                   "empty cache (past_key_values.{i}.* of shape empty_cache, zeros) and gives their cache "
                   "(present.{i}.key / .value); it then reads every answer's own ids after that cache, right-padded "
                   "(attention_mask 1 over the cache and each row's tokens), and gives each row's log_odds as the "
                   "whole prompt's graph does. After an empty cache it reads whole prompts"}}
           if shared else {}),
        "pooling": "each graph reads the decoder's final state at each row's last real token (index "
                   "attention_mask.sum(1) - 1: right padding) through the output layer's rows of the question's "
                   "verdict tokens only: log_odds = logsumexp(logits[positive_token_ids]) - "
                   "logsumexp(logits[negative_token_ids]) (the softmax's normaliser cancels), in fp32",
        "preprocessing": {
            "how": "messages = the question's messages with '{question}' and '{answer}' (pairwise: '{answer_a}', "
                   "'{answer_b}') replaced by the record's texts (plain replacement, not str.format: answers hold "
                   "braces); text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, "
                   "tokenize=False); input_ids = tokenizer.encode(text, add_special_tokens=False), the tokenizer "
                   "of this directory",
            "truncation": {"max_question_tokens": reader.budgets["question"],
                           "max_answer_tokens": reader.budgets["answer"],
                           "how": "a question or answer longer than its budget (tokenizer.encode(text, "
                                  "add_special_tokens=False)) keeps its first budget // 2 and last budget - "
                                  "budget // 2 tokens and is decoded back to text before it is put in the prompt"},
            "padding_side": "right", "pad_token_id": reader.tokenizer.pad_token_id,
            "batch": "rows of any length padded on the right; attention_mask 1 over each row's tokens, 0 after",
        },
        "postprocessing": {
            "score": "reward r(question, answer) = log_odds of the pointwise question (the first one decides)"
            if pointwise else "pairwise: margin = log_odds with answer A shown first; rewards (+margin / 2, "
                              "-margin / 2); both orders combined when the judge compares symmetrically",
            "compare": "d = r_A - r_B; P(A) : P(TIE) : P(B) = exp(scale * d / 2) : nu : exp(-scale * d / 2) "
                       "(Davidson; nu = 0: Bradley-Terry, P(A) = sigmoid(scale * d))",
            "scale": cal.get("scale", 1.0), "nu": cal.get("nu", 0.0),
        },
    }
