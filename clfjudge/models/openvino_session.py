"""OpenVINO running an exported ONNX file on the CPU (the runtime "openvino" of ``clfjudge/runtimes.py``, providers
"openvino" and "openvino-bf16"; ``pip install 'clfjudge[openvino]'``).

The file is the one ``clfjudge export`` wrote and gated (no second export, no OpenVINO IR on disk):
``compile_model(path, "CPU", config)`` on the process's one ``openvino.Core`` (``machine.openvino_core``), with
optimum-intel's latency settings (one stream, ``PERFORMANCE_HINT`` LATENCY, no model cache) and an explicit
``INFERENCE_PRECISION_HINT``: on a CPU with bf16 instructions OpenVINO's own default is bf16, so "openvino" asks for
f32 to run the function the gate passed, and "openvino-bf16" asks for bf16 (refused on a CPU without them rather
than silently run in f32). An f32 run quantizes the activations of int8 / int4-weight products (the verdict judge's
weight-compressed IR variants) to int8 per ``DYNAMIC_QUANTIZATION_GROUP`` input channels as it reads them; the gate
runs each variant with these settings, so it measures what is served.

OpenVINO is imported through ``import_openvino`` alone: ``import openvino`` starts its telemetry (it reads and
rewrites ~/intel/openvino_ga_cid and ~/intel/stats and sends events to an analytics host), which the package turns
off only by a file written in the user's home (``opt_in_out --opt_out``). Imported here, it finds no
``openvino_telemetry`` module and takes the stub it ships for that case: nothing read, written or sent.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..machine import import_openvino  # noqa: F401 - OpenVINO is imported through it alone

INSTALL = "pip install 'clfjudge[openvino]' (or: pip install openvino)"
# OpenVINO's CPU plugin multiplies f32 activations by compressed (int8 / int4) weights in int8, the activations
# quantized at run time per group of this many input channels; products of f32 weights and bf16 runs are left as
# they are. Its default, 32, is the most exact and the slowest: on a 1.5B verdict judge 128 read 1.3-1.4x as fast
# and moved the log-odds about as little (docs/speed.md).
DYNAMIC_QUANTIZATION_GROUP = 128


class Port(NamedTuple):
    name: str


class OpenVinoSession:
    """A compiled model behind onnxruntime's session calls; one infer request per calling thread (a request holds
    its buffers and is not thread-safe; the compiled model is)."""

    def __init__(self, path: Path, hint: str, threads: int | None = None) -> None:
        from ..machine import openvino_core, probe

        try:
            import_openvino()
        except ImportError:
            raise ImportError(f"the OpenVINO providers need the openvino package: {INSTALL}") from None
        core = openvino_core()

        if hint == "bf16" and not (bf16 := probe().openvino_bf16()):
            raise ValueError(f"provider 'openvino-bf16' does not run here ({bf16.why}; OpenVINO would run f32 or "
                             "emulate bf16); use provider 'openvino'")
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY",
                                  "NUM_STREAMS": 1, "CACHE_DIR": ""}
        if hint == "f32":
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = DYNAMIC_QUANTIZATION_GROUP
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        self.path, self.hint = path, hint
        model = core.read_model(str(path))
        # the names the ONNX file declares: a compiled port can carry an inner tensor's name too, and any_name may
        # pick that one (a key/value cache output is also "/model/layers.0/self_attn/Add_output_0")
        self._inputs = [Port(p.any_name) for p in model.inputs]
        self._outputs = [Port(p.any_name) for p in model.outputs]
        self.compiled = core.compile_model(model, "CPU", config)
        self._local = threading.local()

    def get_inputs(self) -> list[Port]:
        return list(self._inputs)

    def get_outputs(self) -> list[Port]:
        return list(self._outputs)

    def run(self, output_names: Sequence[str] | None, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        request.infer({name: np.ascontiguousarray(value) for name, value in feed.items()})
        names = [p.name for p in self._outputs] if output_names is None else list(output_names)
        index = {p.name: i for i, p in enumerate(self._outputs)}
        # copies: the request reuses its output buffers on the next call
        return [np.array(request.get_output_tensor(index[name]).data, copy=True) for name in names]


def open_f32(path: Path, threads: int | None) -> OpenVinoSession:
    return OpenVinoSession(path, "f32", threads)


def open_bf16(path: Path, threads: int | None) -> OpenVinoSession:
    return OpenVinoSession(path, "bf16", threads)
