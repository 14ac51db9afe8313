"""Score an exported judge as another program would: onnxruntime, a tokenizer and signature.json, never clfjudge.

    python standalone_scorer.py EXPORT_DIR ITEMS.json  ->  one JSON line: a result per item

An item is {"question", "answer"} (a score: the reward) or {"question", "answer_a", "answer_b"} (a comparison:
P(A), P(TIE), P(B)). Everything below follows signature.json's text: where this file has to guess, the
signature is incomplete. ``tests/test_export_standalone.py`` runs it in a subprocess that cannot import clfjudge.
"""
from __future__ import annotations

import importlib.abc
import json
import math
import sys
import zlib
from pathlib import Path

import numpy as np


class _NoClfjudge(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "clfjudge" or name.startswith("clfjudge."):
            raise ImportError(f"{name}: the standalone scorer reads the export's files only")
        return None


sys.meta_path.insert(0, _NoClfjudge())

import onnxruntime as ort  # noqa: E402


def _session(directory: Path, name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(directory / name), providers=["CPUExecutionProvider"])


# -- sequence classification: one forward pass per sequence -----------------------------------------------------

def _sequence_ids(signature: dict, tokenizer, fields: dict) -> dict:
    pre = signature["preprocessing"]
    reading = pre["input"]
    if reading == "trl":  # the chat template for messages, plain text as one text
        reading = "chat-template" if fields.get("messages") else "text"
    if reading == "chat-template":
        messages = fields.get("messages") or [{"role": "user", "content": fields["question"]}]
        text = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": fields["answer"]}],
                                             tokenize=False)
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


def score_sequence_classification(directory: Path, signature: dict, items: list[dict]) -> list[dict]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    graph = signature["graphs"][signature["primary"]]
    session = _session(directory, signature["primary"])
    post = signature["postprocessing"]

    def logits(fields: dict) -> np.ndarray:
        feed = _sequence_ids(signature, tokenizer, fields)
        return session.run([graph["outputs"][0]["name"]],
                           {i["name"]: feed[i["name"]] for i in graph["inputs"]})[0][0].astype(np.float64)

    out = []
    for item in items:
        if "answer" in item:  # a reward head: logits[:, 0] (the signature's score formula)
            assert post["score"].startswith("reward r(question, answer) = logits[:, 0]"), post["score"]
            out.append({"score": float(logits(item)[0])})
        else:
            z = logits(item) / post["temperature"]
            p = dict(zip(post["columns"], np.exp(z - z.max()) / np.exp(z - z.max()).sum()))
            out.append({"p_a": float(p["A"]), "p_tie": float(p["TIE"]), "p_b": float(p["B"])})
    return out


# -- an embedding judge's decoder reader: the graph, then the features and the head as the signature states ----

class Reader:
    def __init__(self, directory: Path, signature: dict) -> None:
        from tokenizers import Tokenizer

        self.sig, self.pre = signature, signature["preprocessing"]
        self.embedder = signature["embedder"]
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.session = _session(directory, signature["primary"])
        self.inputs = [i["name"] for i in signature["graphs"][signature["primary"]]["inputs"]]
        self.eos = self.pre["eos_token_id"]

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def prompt_ids(self, question: str) -> list[int]:
        before, after = self.pre["template"]
        ids, limit = self.ids(before + question + after), self.embedder["max_prompt_tokens"]
        return ids if len(ids) <= limit else ids[:limit // 2] + ids[len(ids) - (limit - limit // 2):]

    def read(self, prefix: list[int], body: list[int]) -> tuple[np.ndarray, np.ndarray | None]:
        """One unpadded input: the pooled vector over ``body`` and the log-probabilities of its scored tokens."""
        n = self.embedder.get("stats_tokens") or len(body)
        scored = body[:n]
        feed = {"input_ids": np.array([prefix + body], dtype=np.int64),
                "attention_mask": np.ones((1, len(prefix) + len(body)), dtype=np.int64),
                "pool": np.array([[0.0] * len(prefix) + [1 / len(body)] * len(body)], dtype=np.float32),
                "positions": np.array([[max(0, len(prefix) - 1 + j) for j in range(len(scored))]], dtype=np.int64),
                "targets": np.array([scored], dtype=np.int64)}
        outputs = self.session.run(None, {k: feed[k] for k in self.inputs})
        return outputs[0][0].astype(np.float64), (outputs[1][0] if len(outputs) > 1 else None)

    @staticmethod
    def unit(v: np.ndarray) -> np.ndarray:
        norm = np.linalg.norm(v)
        return v / norm if norm > 0 else v

    def v_answer(self, question: str, answer: str) -> tuple[np.ndarray, np.ndarray | None, int]:
        body = self.ids(answer)[:self.embedder["max_answer_tokens"]] + [self.eos]
        pooled, cond = self.read(self.prompt_ids(question), body)
        return self.unit(pooled), cond, len(body)

    def v_text(self, text: str) -> np.ndarray:
        limit = self.embedder["max_prompt_tokens"] + self.embedder["max_answer_tokens"]
        return self.unit(self.read([], self.ids(text)[:limit] + [self.eos])[0])

    def stats(self, answer: str, cond: np.ndarray, n_tokens: int) -> np.ndarray:
        body = self.ids(answer)[:self.embedder["max_answer_tokens"]] + [self.eos]
        uncond = self.read(self.prompt_ids(""), body)[1]
        pmi = cond.astype(np.float64) - uncond
        return np.array([pmi.mean(), (pmi > 0).mean(), np.median(pmi), pmi[:32].mean(), cond.mean(), uncond.mean(),
                         math.log(n_tokens)], dtype=np.float32).astype(np.float64)


def info_length(text: str) -> float:
    """I(t) of the signature's notation."""
    return math.log1p(len(zlib.compress(text.encode("utf-8", "surrogatepass"), 6)) - 8)


def log_lengths(text: str) -> np.ndarray:
    return np.log1p([len(text), len(text.split())])


def _cos(x: np.ndarray, y: np.ndarray) -> float:
    norms = np.linalg.norm(x) * np.linalg.norm(y)
    return float(x @ y / norms) if norms > 0 else 0.0


def _one_side(reader: Reader, question: str, answer: str) -> dict:
    v, cond, n = reader.v_answer(question, answer)
    return {"v": v, "s": None if cond is None else reader.stats(answer, cond, n), "L": log_lengths(answer),
            "I": np.array([info_length(answer)])}


# The groups' formulas (signature: postprocessing.features.groups[].formula), over one-answer terms a, b and q.
GROUPS = {
    "v(A) - v(B)": lambda a, b, q: a["v"] - b["v"],
    "v(Q) * (v(A) - v(B))": lambda a, b, q: q["v"] * (a["v"] - b["v"]),
    "|v(A) - v(B)|": lambda a, b, q: np.abs(a["v"] - b["v"]),
    "v(A) * v(B)": lambda a, b, q: a["v"] * b["v"],
    "c(v(Q), v(A)) - c(v(Q), v(B))": lambda a, b, q: np.array([_cos(q["v"], a["v"]) - _cos(q["v"], b["v"])]),
    "s(A) - s(B)": lambda a, b, q: a["s"] - b["s"],
    "L(A) - L(B)": lambda a, b, q: a["L"] - b["L"],
    "I(A) - I(B)": lambda a, b, q: a["I"] - b["I"],
}
ONE_SIDE = {"v(A) - v(B)": lambda a, q: a["v"], "v(Q) * (v(A) - v(B))": lambda a, q: q["v"] * a["v"],
            "c(v(Q), v(A)) - c(v(Q), v(B))": lambda a, q: np.array([_cos(q["v"], a["v"])]),
            "s(A) - s(B)": lambda a, q: a["s"], "L(A) - L(B)": lambda a, q: a["L"], "I(A) - I(B)": lambda a, q: a["I"]}
CODING = {0: "TIE", 1: "A", 2: "B"}


def _head_proba(head: dict, x: np.ndarray) -> dict[str, float]:
    z = ((x - np.array(head["mean"])) / np.array(head["scale"]) * np.array(head["weights"])) @ np.array(
        head["coef"]).T + np.array(head["intercept"])
    if len(head["coef"]) == 1:
        p1 = 1 / (1 + math.exp(-z[0]))
        proba = [1 - p1, p1]
    else:
        e = np.exp(z - z.max())
        proba = list(e / e.sum())
    out = {"A": 0.0, "TIE": 0.0, "B": 0.0}
    out.update({CODING[int(c)]: float(p) for c, p in zip(head["classes"], proba)})
    return out


def score_decoder_reader(directory: Path, signature: dict, items: list[dict]) -> list[dict]:
    reader, post = Reader(directory, signature), signature["postprocessing"]
    groups, head = post["features"]["groups"], post["head"]
    needs_q = any("Q" in g["formula"] for g in groups)
    out = []
    for item in items:
        q = {"v": reader.v_text(item["question"])} if needs_q else {}
        if "answer" in item:  # the reward: each group's one-answer term . (coef_row(A) - coef_row(B))
            a = _one_side(reader, item["question"], item["answer"])
            f = np.concatenate([ONE_SIDE[g["formula"]](a, q) for g in groups])
            rows = {int(c): np.zeros(len(f)) for c in head["classes"]}
            coef = np.array(head["coef"])
            if len(coef) == 1:
                rows[int(head["classes"][1])] = coef[0]
            else:
                rows.update({int(c): coef[j] for j, c in enumerate(head["classes"])})
            direction = rows[1] - rows[2]
            out.append({"score": float((f / np.array(head["scale"]) * np.array(head["weights"])) @ direction)})
            continue
        a = _one_side(reader, item["question"], item["answer_a"])
        b = _one_side(reader, item["question"], item["answer_b"])
        forward = _head_proba(head, np.concatenate([GROUPS[g["formula"]](a, b, q) for g in groups]))
        backward = _head_proba(head, np.concatenate([GROUPS[g["formula"]](b, a, q) for g in groups]))
        p = {"A": (forward["A"] + backward["B"]) / 2, "TIE": (forward["TIE"] + backward["TIE"]) / 2,
             "B": (forward["B"] + backward["A"]) / 2}
        t = post["temperature"]
        logp = {k: math.log(max(v, 1e-12)) / t for k, v in p.items()}
        top = max(logp.values())
        total = sum(math.exp(v - top) for v in logp.values())
        out.append({f"p_{k.lower()}": math.exp(v - top) / total for k, v in logp.items()})
    return out


SCORERS = {"sequence-classification": score_sequence_classification, "decoder-reader": score_decoder_reader}


def main(directory: str, items_file: str) -> None:
    directory = Path(directory)
    signature = json.loads((directory / "signature.json").read_text())
    results = SCORERS[signature["task"]](directory, signature, json.loads(Path(items_file).read_text()))
    clfjudge_loaded = sorted(m for m in sys.modules if m == "clfjudge" or m.startswith("clfjudge."))
    print(json.dumps({"results": results, "clfjudge_modules": clfjudge_loaded}))


if __name__ == "__main__":
    main(*sys.argv[1:])
