"""The runtimes: what runs an exported judge's ONNX files (onnxruntime, OpenVINO). One entry per runtime names,
lazily, how each of its providers opens a file and what says whether that provider runs on this machine.

Every judge kind exports to one form, the backend ``EXPORTED`` of its loaders (``kinds.JudgeKind.loaders``); a
runtime runs that form's files. ``register_runtime`` fills ``PROVIDERS`` (provider name -> ``Provider``: what
``LoadOptions.provider``, ``clfjudge score / serve --provider`` and ``clfjudge export --provider`` take; read by
``models.onnx_session.inference_session``) and adds the runtime's machine facts to ``machine.PROBES`` (probed once
per process, on first use; a simulated machine gives them as it gives the built-in ones). Registering a runtime
once makes its providers loadable, gateable by the export and offered by every ``--provider``.

Like ``kinds``, this module sits below every subpackage and names what opens a file as a lazy
``"module:function"`` target (``registry.resolve``), importing none of them.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from . import machine
from .machine import Capability
from .registry import Registry, resolve, undone_after

Target = Callable[..., Any] | str  # a function, or a lazy "module:function" target
EXPORTED = "onnx"  # the backend of every kind's exported form: its loader runs it on a provider (Judge.load)


def runs_everywhere() -> Capability:
    return Capability(True, "runs on every machine")


def capability(name: str) -> Callable[[], Capability]:
    """``machine.probe().<name>()``, looked up when asked (tests simulate other machines by replacing the probe)."""
    def check() -> Capability:
        return getattr(machine.probe(), name)()

    return check


def fact(name: str) -> Callable[[], Capability]:
    """A provider's ``available`` read off one machine fact (a runtime's ``probes`` entry), looked up when asked."""
    def check() -> Capability:
        return Capability(*machine.probe().fact(name))

    return check


@dataclass(frozen=True)
class Provider:
    """``open``: ``(path, threads) -> session``, a session answering ``get_inputs()``, ``get_outputs()`` (items with
    a ``.name``) and ``run(output_names | None, feed)`` as an ``onnxruntime.InferenceSession`` does; ``threads``:
    intra-op threads (None: the runtime's default). ``precision``: the arithmetic it runs the fp32 file in ("fp32":
    the same function up to float rounding; any other runs a judge only where the export's parity gate measured it).
    ``available``: ``() -> machine.Capability``, whether it runs on this machine and why (not just "is installed";
    ``fact(name)``: what the runtime's probe ``name`` says).
    ``runtime``: the runtime it belongs to (set by ``register_runtime``)."""

    open: Target
    precision: str = "fp32"
    available: Callable[[], Capability] = runs_everywhere
    runtime: str = field(default="", compare=False)


@dataclass(frozen=True)
class Runtime:
    """``providers``: provider name -> ``Provider``. ``probes``: the runtime's machine facts, fact name -> ``() ->
    (runs, detail)`` (``machine.PROBES``; a probe that raises answers "does not run"), which its providers'
    ``available`` read through ``machine.probe().fact(name)``. ``help``: one line for listings."""

    providers: Mapping[str, Provider]
    probes: Mapping[str, Target] = field(default_factory=dict)
    help: str = field(default="", compare=False)


RUNTIMES: Registry[Runtime] = Registry("runtime")
PROVIDERS: Registry[Provider] = Registry("ONNX provider")


def register_runtime(name: str, runtime: Runtime) -> Runtime:
    """Register a runtime, its providers and its machine facts; a name any of them holds already is refused before
    anything is registered."""
    taken = ([f"runtime {name!r}"] * (name in RUNTIMES)
             + [f"provider {p!r}" for p in runtime.providers if p in PROVIDERS]
             + [f"machine fact {f!r}" for f in runtime.probes if f in machine.PROBES])
    if taken:
        raise ValueError(f"runtime {name!r}: {', '.join(taken)} is registered already")
    RUNTIMES.register(name, runtime)
    for provider, entry in runtime.providers.items():
        PROVIDERS.register(provider, replace(entry, runtime=name))
    for fact, probe in runtime.probes.items():
        machine.PROBES[fact] = lambda probe=probe: resolve(probe)()
    return runtime


def unregister_runtime(name: str) -> None:
    runtime = RUNTIMES.get(name)
    for provider in runtime.providers:
        PROVIDERS.unregister(provider)
    for fact in runtime.probes:
        machine.PROBES.pop(fact, None)
        machine.probe().facts.pop(fact, None)
    RUNTIMES.unregister(name)


registered_runtime = undone_after(register_runtime, unregister_runtime)  # ``register_runtime`` for a block (tests)


# The built-in runtimes. Their machine facts are machine.py's own (``machine.PROBES``: ort_cuda, openvino), which
# ``machine.Machine`` composes with the CPU's (``openvino_bf16``: OpenVINO and the CPU both run bf16).
register_runtime("onnxruntime", Runtime(
    providers={"cpu": Provider("clfjudge.models.onnx_session:open_cpu",
                               available=lambda: Capability(True, "onnxruntime's CPU provider runs everywhere")),
               "cuda": Provider("clfjudge.models.onnx_session:open_cuda", available=capability("ort_cuda"))},
    help="onnxruntime: its CPU provider, and CUDA with onnxruntime-gpu"))
register_runtime("openvino", Runtime(
    providers={"openvino": Provider("clfjudge.models.openvino_session:open_f32", available=capability("openvino")),
               "openvino-bf16": Provider("clfjudge.models.openvino_session:open_bf16", precision="bf16",
                                         available=capability("openvino_bf16"))},
    help="OpenVINO compiling the ONNX file for the CPU, in f32 or bf16 (the openvino extra)"))
