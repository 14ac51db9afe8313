"""The exporters' console lines a user can do nothing about, silenced where they arise and nowhere else: each
helper is a context manager around one library call, and every other warning still shows.

- ``torch_onnx_export``: around ``torch.onnx.export``. The TorchScript tracer (``dynamo=False``: the decoder
  reader's graphs, the fallback of the fine-tuned heads') warns (``TracerWarning``) about every Python value it
  records as a constant, such as a shape read in the model's forward; the graph is checked against PyTorch by the
  parity gate anyway; torch.onnx notes that the tracer is its legacy exporter. The dynamo exporter warns, from
  inside ``torch.onnx``, about how it converts the dynamic axes it is given, and logs that torchvision's operators
  are not registered (clfjudge exports none).
- ``quantization``: around ``onnxruntime.quantization.quantize_dynamic``, which logs on the root logger a hint to
  run its pre-processing script first; the export prepares the graph as its quantizer needs
  (``export.quantize.quantize_onnx``) and the parity gate judges what quantization gives. The int4 quantizer
  (``MatMulNBitsQuantizer``) logs a line at INFO for every node of the graph it leaves alone.
- ``nncf``: around NNCF's weight compression and quantization (a verdict judge's OpenVINO variants).
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

TORCH_ONNX_LOGGERS = ("torch.onnx._internal.exporter._registration",)
QUANTIZATION_LOGGERS = ("onnxruntime.quantization.matmul_nbits_quantizer",)
PREPROCESSING_HINT = "Please consider"  # both spellings of onnxruntime's hint start so


@contextlib.contextmanager
def torch_onnx_export() -> Iterator[None]:
    import torch

    loggers = [logging.getLogger(name) for name in TORCH_ONNX_LOGGERS]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", module=r"torch\.onnx\.")
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
        # dynamo=False is chosen where the tracer exports what dynamo cannot (export/embedding.py)
        warnings.filterwarnings("ignore", message="You are using the legacy TorchScript-based ONNX export",
                                category=DeprecationWarning)
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


class _DropHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.pathname.replace("\\", "/").endswith("onnxruntime/quantization/quantize.py")
                    and str(record.msg).startswith(PREPROCESSING_HINT))


@contextlib.contextmanager
def quantization() -> Iterator[None]:
    root, hint = logging.getLogger(), _DropHint()
    loggers = [logging.getLogger(name) for name in QUANTIZATION_LOGGERS]
    levels = [logger.level for logger in loggers]
    root.addFilter(hint)
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.removeFilter(hint)
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def nncf() -> Iterator[None]:
    """Around an NNCF call: its INFO tables (the bit-width statistics) and its progress bars, which it draws on
    standard output; the export says which step it is in, and its report what each variant is."""
    import io

    import nncf as nncf_module

    logger = logging.getLogger("nncf")
    level = logger.level
    nncf_module.set_log_level(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)
