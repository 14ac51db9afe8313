"""onnxruntime sessions as every ONNX judge opens them: the classifier backend (``judges.model.OnnxBackend``) and
the embedding judge's decoder reader (``embedders.onnx_reader.OnnxDecoderReader``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


def inference_session(path: str | Path, provider: str = "cpu", threads: int | None = None) -> Any:
    """An ``onnxruntime.InferenceSession`` on ``path`` with ``provider``'s execution providers; ``threads``:
    intra-op threads (one inter-op thread), default onnxruntime's."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=PROVIDERS[provider])
