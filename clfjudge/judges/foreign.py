"""A model clfjudge did not write, as a judge: a transformers sequence-classification directory (a released reward
model, one TRL's RewardTrainer saved, any ``save_pretrained`` of ``AutoModelForSequenceClassification``) or a hub
id ``hf:OWNER/NAME[@REVISION]``, opened without a judge card.

``describe(spec)`` reads what the directory says about itself and writes the card a clfjudge judge would have:

- one output: a reward model (head ``reward``: ``score`` is the raw reward r(question, answer); ``compare`` is
  Bradley-Terry, P(A better) = sigmoid(r_A - r_B), no ties until ``clfjudge calibrate`` fits a tie model);
  two outputs: a classifier whose class 1 (``id2label[1]``, the transformers convention for the positive
  class; ``label_map.positive`` in the card says otherwise) is "good": its log-odds are the reward
  (head ``reward-binary``); more outputs are refused, naming their labels;
- the input as TRL's ``GRPOTrainer(reward_funcs=[path])`` gives it to the model (``prompts.model_input``): a
  decoder's chat template over a conversation given as messages (system prompt, every turn, then the answer), a
  plain-text prompt and its answer as one text (TRL's standard format; input ``trl``), or where its tokenizer has no
  chat template always as one text (``text``); an encoder's text pair (question, answer); ``model_input``
  overrides (``chat-template``: the chat template over plain-text prompts too);
- where it came from (``training.origin``: path or hub id, revision, the sha256 of each weights file).

Then the ``torch`` loader runs it like a fine-tuned judge, and ``clfjudge export`` / ``audit`` write the card
(``write_card``). A foreign directory is untrusted input: no code from it ever runs (``trust_remote_code`` is
never set; a config naming custom code is refused), weights are safetensors, or a ``pytorch_model.bin`` read by
``torch.load(weights_only=True)``; configuration files past the size or nesting limits of ``untrusted.read_json``,
or naming files outside the directory, are refused.
"""
from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..card import CARD_NAME, JudgeCard
from ..models.backbones import family_of
from ..models.heads import FINE_TUNED, HEADS
from ..prompts.model_input import INPUTS
from ..prompts.truncation import TruncationPolicy
from ..untrusted import check_directory, inside, read_json

HUB_PREFIX = "hf:"
# Files fetched for a hub id: configuration, tokenizer and safetensors weights, never code or pickles.
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# Configuration files transformers reads from a model directory (the files they name: ``untrusted.FILE_FIELDS``).
CONFIG_FILES = ("config.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                "preprocessor_config.json", *SAFE_WEIGHTS[1:], *PICKLED_WEIGHTS[1:])
# A foreign model reads at most this many tokens per answer unless its card says otherwise (decoder RMs declare
# 32k-128k positions; an answer that long is cut, question first kept, as a scheme's inputs are).
MAX_LENGTH = 4096
DEFAULT_INPUT = {"decoder": "trl", "encoder": "text-pair"}
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
HEAD_OF_OUTPUTS = {1: "reward", 2: "reward-binary"}  # outputs of the model -> the head that reads them


class ForeignModelError(ValueError):
    """A directory that cannot be opened as a judge, and why."""


def is_hub_id(spec: str) -> bool:
    return spec.startswith(HUB_PREFIX)


def fetch(spec: str) -> tuple[Path, dict[str, Any]]:
    """A hub id's snapshot (configuration, tokenizer, safetensors only) and its origin; the hub is asked only
    here, when a user names a hub id."""
    from huggingface_hub import snapshot_download

    repo, _, revision = spec[len(HUB_PREFIX):].partition("@")
    try:
        path = Path(snapshot_download(repo, revision=revision or None, allow_patterns=HUB_FILES))
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, no network: one clear error
        raise FileNotFoundError(f"{spec}: the model could not be fetched from the hub or found in the local Hugging "
                                f"Face cache ({type(exc).__name__}: {str(exc)[:300]}); pass a local directory "
                                "saved with save_pretrained") from None
    return path, {"hub_id": repo, "revision": path.name, "requested_revision": revision or "main"}


def _configs(directory: Path) -> dict[str, Any]:
    """Every configuration file present, read within the limits (the files they name were checked to stay inside
    by ``untrusted.check_directory``)."""
    out = {}
    for name in CONFIG_FILES:
        path = directory / name
        if not path.is_file():
            continue
        data = out[name] = read_json(path)
        if not isinstance(data, dict):
            raise ForeignModelError(f"{path}: a configuration file is a JSON object, got {type(data).__name__}")
    return out


def check_no_code(directory: Path, configs: dict[str, Any]) -> None:
    """Refuse a model that needs its own code: clfjudge never sets ``trust_remote_code``."""
    for name, data in configs.items():
        if "auto_map" in data:
            raise ForeignModelError(f"{directory / name}: field 'auto_map' names custom code "
                                    f"({data['auto_map']!r:.120}); clfjudge never runs code from a model directory "
                                    "(trust_remote_code is never set): refused")


def weights_files(directory: Path) -> list[Path]:
    """The weights transformers will load: safetensors; else a pickled ``pytorch_model.bin``, which
    ``judges.model.TorchBackend`` reads only through ``torch.load(weights_only=True)``; anything else is refused."""
    for names in (SAFE_WEIGHTS, PICKLED_WEIGHTS):
        index = directory / names[1]
        if index.is_file():
            shards = read_json(index).get("weight_map")
            if not isinstance(shards, dict) or not shards:
                raise ForeignModelError(f"{index}: field 'weight_map' must map tensors to shard files")
            return sorted({inside(directory, s, f"{index} field 'weight_map'") for s in shards.values()})
        if (directory / names[0]).is_file():
            return [inside(directory, names[0], str(directory))]
    others = sorted(p.name for p in directory.iterdir() if p.suffix in (".h5", ".msgpack", ".ckpt", ".pt", ".pth"))
    raise ForeignModelError(f"{directory}: no model.safetensors (or pytorch_model.bin, read with weights_only) to "
                            f"load{f'; found {others}, which clfjudge does not load' if others else ''}")


@functools.cache
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def weights_sha256(files: list[Path]) -> dict[str, str]:
    """sha256 of each weights file (hashed once per process while the file is unchanged)."""
    return {p.name: _sha256(p.resolve(), p.stat().st_size, p.stat().st_mtime_ns) for p in files}


def _max_length(config: dict[str, Any], tokenizer_config: dict[str, Any]) -> int:
    limits = [MAX_LENGTH, config.get("max_position_embeddings"), config.get("n_positions"),
              tokenizer_config.get("model_max_length")]
    return int(min(n for n in limits if isinstance(n, (int, float)) and not isinstance(n, bool) and n > 0))


def _head(directory: Path, config: dict[str, Any]) -> str:
    architectures = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        raise ForeignModelError(f"{directory / 'config.json'}: field 'architectures' is {architectures}: not a "
                                "sequence-classification model (AutoModelForSequenceClassification), which is what "
                                "clfjudge can run as a judge")
    labels = config.get("id2label") or {}
    n = len(labels) or int(config.get("num_labels", 2))
    if n not in HEAD_OF_OUTPUTS:
        raise ForeignModelError(f"{directory / 'config.json'}: {n} outputs (id2label {labels}): clfjudge opens a "
                                "foreign model with one output (a reward) or two (the log-odds of class 1 as the "
                                "reward); what more classes mean needs a judge card")
    return HEAD_OF_OUTPUTS[n]


def _default_input(directory: Path, family: str, tokenizer_config: dict[str, Any]) -> str:
    """A decoder without a chat template was trained on plain text (TRL's standard format): it reads ``text``."""
    has_template = tokenizer_config.get("chat_template") or any((directory / n).is_file() for n in CHAT_TEMPLATE_FILES)
    return "text" if family == "decoder" and not has_template else DEFAULT_INPUT[family]


def describe(spec: str | os.PathLike, model_input: str | None = None) -> tuple[Path, JudgeCard]:
    """The directory a spec names (a local directory or ``hf:OWNER/NAME[@REV]``) and the judge card of the model in
    it, checked as untrusted input (see the module doc). ``model_input``: a name of ``prompts.model_input.INPUTS``
    (default: by the model's family, as TRL reads it)."""
    text = os.fspath(spec)
    if is_hub_id(text):
        directory, origin = fetch(text)
    else:
        directory, origin = Path(text), {"path": str(Path(text).resolve())}
        if not directory.is_dir():
            raise FileNotFoundError(f"{directory} is not a judge directory: it does not exist")
        if not (directory / "config.json").is_file():
            raise FileNotFoundError(f"{directory} is not a judge directory: {CARD_NAME} is missing, and it is not a "
                                    "transformers model either (config.json is missing)")
    check_directory(directory)
    configs = _configs(directory)
    check_no_code(directory, configs)
    config, tokenizer_config = configs["config.json"], configs.get("tokenizer_config.json", {})
    head = _head(directory, config)
    family = family_of(config, str(directory / "config.json"))
    model_input = model_input or _default_input(directory, family, tokenizer_config)
    INPUTS.get(model_input)  # an unknown name is refused here, naming the known ones
    files = weights_files(directory)
    origin = {**origin, "model_type": config.get("model_type"), "architectures": config.get("architectures"),
              "weights_sha256": weights_sha256(files)}
    labels = {str(k): str(v) for k, v in (config.get("id2label") or {}).items()}
    reward = HEADS.get(head).from_labels(labels)
    policy = TruncationPolicy(max_length=_max_length(config, tokenizer_config))
    card = JudgeCard(kind=FINE_TUNED, head=head, arity=reward.arity, backbone=origin.get("hub_id", origin.get("path")),
                     scheme=model_input, max_length=policy.max_length,
                     truncation={"policy": asdict(policy), "input": model_input,
                                 "conversation": INPUTS.get(model_input).conversation}, training={"origin": origin},
                     **reward.card_fields())
    return directory, card


def write_card(directory: Path, card: JudgeCard) -> Path | None:
    """Save a described card beside the model it describes (the first export or audit does), so later runs read
    it and the user can edit it; None where the directory already has one or cannot be written (a hub cache)."""
    if (directory / CARD_NAME).exists() or "hub_id" in card.training.get("origin", {}) or not os.access(directory,
                                                                                                          os.W_OK):
        return None
    return card.save(directory)
