"""Shared fixtures. No hub is reachable here: force offline mode before anything imports
huggingface_hub (it reads HF_HUB_OFFLINE once, at import), so hub lookups fail fast instead of retrying."""
from __future__ import annotations

import contextlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from clfjudge import testing  # noqa: E402


@pytest.fixture()
def override():
    """``override(REGISTRY, name, item)``: ``REGISTRY.override(name, item)`` until the test ends (the registries are
    process-global)."""
    with contextlib.ExitStack() as stack:
        yield lambda registry, name, item: stack.enter_context(registry.override(name, item))


@pytest.fixture(scope="session")
def tiny_deberta_dir(tmp_path_factory):
    """DeBERTa-v3 style classifier (3 labels) with a locally trained spm tokenizer."""
    return testing.tiny_deberta(tmp_path_factory.mktemp("tiny-deberta"), num_labels=3)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """LLaMA causal LM with a byte-level BPE tokenizer; pad <|endoftext|> (0) != eos."""
    return testing.tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    """BERT encoder with a WordPiece tokenizer."""
    return testing.tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray instance for a module (two CPUs, as on this machine); drivers in subprocesses join it.
    Its workers run at the tests' niceness: Ray's default (+15) starves them on a machine shared with other jobs.
    The modules that use it skip themselves where the ray extra is not installed."""
    import ray

    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_worker_niceness", "0")
        ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
