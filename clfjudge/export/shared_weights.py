"""One copy on disk of the weights several ONNX graphs hold: ``share_weights`` moves every large initializer of the
given graphs into one external-data file beside them, each distinct tensor (same type, shape and bytes) written
once, and points every graph's copy at that one (ONNX external data: location, offset, length). onnxruntime and
OpenVINO read the graphs as before; the decoder reader's three graphs (reader, prefix, continuation: the same
layers) then take the disk of one.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SHARED_WEIGHTS = "weights.data"
MIN_BYTES = 1024  # smaller tensors (scalars, shapes) stay inside their graph
ALIGN = 4096  # each tensor starts on a page boundary, so a runtime can map it


def _side_files(path: Path) -> set[str]:
    """The external-data files a graph reads its tensors from."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {entry.value for tensor in model.graph.initializer for entry in tensor.external_data
            if entry.key == "location"}


def share_weights(directory: Path, files: Sequence[str], data_name: str = SHARED_WEIGHTS) -> dict[str, Any]:
    """Rewrite ``files`` (ONNX graphs in ``directory``, their weights inline or in side files of their own, which
    are removed) to read their large initializers from ``directory / data_name``, one copy per distinct tensor.
    Returns the sizes before and after."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import set_external_data

    side = set().union(*(_side_files(directory / name) for name in files))
    if data_name in side:
        raise ValueError(f"{directory}: a graph reads {data_name} already; its weights are shared")
    before = sum((directory / name).stat().st_size for name in [*files, *side])
    where: dict[tuple[int, tuple[int, ...], str], tuple[int, int]] = {}
    shared = tensors = 0
    with (directory / data_name).open("wb") as out:
        for name in files:
            model = onnx.load(str(directory / name))
            for tensor in model.graph.initializer:
                raw = tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes()
                if len(raw) < MIN_BYTES:
                    continue
                key = (tensor.data_type, tuple(tensor.dims), hashlib.sha256(raw).hexdigest())
                tensors += 1
                if key in where:
                    shared += 1
                else:
                    out.write(b"\0" * (-out.tell() % ALIGN))
                    where[key] = (out.tell(), len(raw))
                    out.write(raw)
                if not tensor.HasField("raw_data"):
                    tensor.raw_data = raw  # what set_external_data checks for
                set_external_data(tensor, location=data_name, offset=where[key][0], length=where[key][1])
                for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data"):
                    tensor.ClearField(field)
            onnx.save(model, str(directory / name))
    for name in side:
        (directory / name).unlink()
    after = sum((directory / name).stat().st_size for name in files) + (directory / data_name).stat().st_size
    return {"file": data_name, "graphs": list(files), "tensors": tensors, "shared_tensors": shared,
            "bytes_before": before, "bytes_after": after}
