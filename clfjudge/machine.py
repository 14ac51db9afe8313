"""What this machine can run: the one capability probe behind every machine-dependent choice (decoder precision,
training precision on CUDA, int8 settings per instruction set, ONNX / OpenVINO providers), and what a run records
about its machine.

``probe()`` answers "runs here", not "is installed": OpenVINO counts only if it compiles for this CPU, bf16 only
if the CPU has bf16 instructions that oneDNN is allowed to use, CUDA only if a device is there. It never raises: a
probe that fails answers "does not run", with the reason. Each answer is a ``Capability`` (runs, why), so a choice
can say why it was made (run.json, the judge card's runtime section, the server's /metrics).

``ONEDNN_MAX_CPU_ISA`` (oneDNN's cap, which PyTorch honours) caps what the probe reports, so that one variable makes
every library and every clfjudge choice behave as on an older CPU (e.g. ``AVX512_CORE_VNNI``: no bf16; ``AVX2``).

Tests simulate other machines by replacing ``probe`` (``clfjudge.testing.simulated_machine``); every caller looks it
up at call time (``machine.probe()``), never at import.
"""
from __future__ import annotations

import functools
import os
import platform
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ISA_CAP_ENV = "ONEDNN_MAX_CPU_ISA"
# oneDNN's ISA names, lowest first (its docs: "dev_guide_cpu_dispatcher_control"); DEFAULT / ALL mean no cap
ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
               "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512",
               "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2")
# the /proc/cpuinfo flags a choice depends on, and the oneDNN level that must not be capped away to use them
FLAG_ISA = {"avx2": "AVX2", "avx512f": "AVX512_CORE", "avx512bw": "AVX512_CORE", "avx512_vnni": "AVX512_CORE_VNNI",
            "avx512_bf16": "AVX512_CORE_BF16", "amx_bf16": "AVX512_CORE_AMX", "amx_int8": "AVX512_CORE_AMX"}
MATMUL_FLAGS = ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx512bw", "avx512f", "avx2", "bf16")
ARM = ("arm64", "aarch64")


def import_openvino():
    """The ``openvino`` module, its telemetry off for this process: ``import openvino`` starts it otherwise (it
    reads and rewrites files under ~/intel and looks up an analytics host); ImportError where it is not
    installed. Every clfjudge import of OpenVINO goes through here."""
    if "openvino" not in sys.modules:
        # a None entry makes "import openvino_telemetry" fail, so OpenVINO falls back to its own no-op stub
        sys.modules.setdefault("openvino_telemetry", None)
    import openvino

    return openvino


@functools.cache
def openvino_core():
    """The process's one ``openvino.Core``, kept for its lifetime. Each Core's CPU plugin sets an alternate signal
    stack on the thread that compiles and puts back the one it found when it goes; Cores released out of the order
    they were made (two gates' sessions, garbage-collected in any order) leave the thread on a freed stack, and the
    next Ctrl-C or SIGTERM kills the process with a segmentation fault instead of stopping it cleanly. One Core that
    outlives every other keeps that stack valid."""
    return import_openvino().Core()


@dataclass(frozen=True)
class Capability:
    runs: bool
    why: str

    def __bool__(self) -> bool:
        return self.runs

    def as_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "why": self.why}


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpu_flags(cpuinfo: str) -> frozenset[str]:
    """x86 "flags" or arm64 "Features" of the first CPU."""
    line = next((line for line in cpuinfo.splitlines() if line.startswith(("flags", "Features"))), "")
    return frozenset(line.split(":", 1)[1].split()) if ":" in line else frozenset()


def _cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _arch() -> str:
    machine = platform.machine().lower()
    return "arm64" if machine in ARM else "x86_64" if machine in ("x86_64", "amd64") else machine


# Facts that cost an import or a device initialisation, probed on first use. Each returns (value, detail).
def _probe_torch_cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:  # an ONNX-only install (export/Dockerfile)
        return False, "torch is not installed"

    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    return True, torch.cuda.get_device_name(0)


def _probe_cuda_bf16() -> tuple[bool, str]:
    import torch

    supported = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return supported, "the GPU computes in bf16" if supported else "this GPU has no bf16 (before Ampere)"


def _probe_ort_cuda() -> tuple[bool, str]:
    import onnxruntime as ort

    ok = "CUDAExecutionProvider" in ort.get_available_providers()
    return ok, "onnxruntime has CUDAExecutionProvider" if ok else "this onnxruntime build lacks CUDA (onnxruntime-gpu)"


def _probe_openvino() -> tuple[bool, str]:
    import importlib.util

    if importlib.util.find_spec("openvino") is None:
        return False, "openvino is not installed (pip install 'clfjudge[openvino]')"

    core = openvino_core()
    if "CPU" not in core.available_devices:
        return False, f"OpenVINO has no CPU device here (devices: {core.available_devices})"
    return True, ",".join(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


PROBES: dict[str, Callable[[], tuple[bool, str]]] = {
    "torch_cuda": _probe_torch_cuda, "cuda_bf16": _probe_cuda_bf16, "ort_cuda": _probe_ort_cuda,
    "openvino": _probe_openvino,
}


@dataclass
class Machine:
    """A machine's facts and what follows from them. ``facts`` holds the probed (or, for a simulated machine, given)
    values of ``PROBES``, each (value, detail); a missing one is probed on first use."""

    arch: str
    cpu: str
    flags: frozenset[str]
    isa_cap: str | None = None
    facts: dict[str, tuple[bool, str]] = field(default_factory=dict)

    def fact(self, name: str) -> tuple[bool, str]:
        if name not in self.facts:
            try:
                self.facts[name] = PROBES[name]()
            except Exception as e:  # noqa: BLE001 - a failed probe means "does not run here", never a crash
                self.facts[name] = (False, f"probe failed: {type(e).__name__}: {e}")
        return self.facts[name]

    # --- the CPU -------------------------------------------------------------------------------------------------
    def _usable(self, flag: str) -> bool:
        """The CPU has ``flag`` and the ISA cap does not forbid it."""
        if flag not in self.flags:
            return False
        need = FLAG_ISA.get(flag)
        if not self.isa_cap or need is None or self.isa_cap not in ONEDNN_ISAS:
            return True
        return ONEDNN_ISAS.index(need) <= ONEDNN_ISAS.index(self.isa_cap)

    def _capped(self) -> str:
        return f" ({ISA_CAP_ENV}={self.isa_cap})" if self.isa_cap else ""

    def cpu_bf16(self) -> Capability:
        if self.arch == "arm64":
            ok = "bf16" in self.flags
            return Capability(ok, "arm64 CPU with BF16" if ok else "arm64 CPU without the BF16 extension")
        found = [f for f in ("amx_bf16", "avx512_bf16") if self._usable(f)]
        if found:
            return Capability(True, f"CPU has {found[0]}")
        had = [f for f in ("amx_bf16", "avx512_bf16") if f in self.flags]
        return Capability(False, f"CPU has {had[0]} but it is capped away{self._capped()}" if had
                          else "CPU has no bf16 instructions (neither AVX512-BF16 nor AMX)")

    def amx(self) -> Capability:
        ok = self._usable("amx_bf16")
        return Capability(ok, "CPU has AMX" if ok else f"no AMX{self._capped()}")

    def int8_isa(self) -> tuple[str, str]:
        """The instruction set int8 settings are chosen for (clfjudge/configs/int8.yaml): avx512_vnni | avx512 |
        avx2 | arm64 (x86 without AVX2 takes the avx2 settings, the most conservative)."""
        if self.arch == "arm64":
            return "arm64", "arm64 CPU"
        for flag, isa in (("avx512_vnni", "avx512_vnni"), ("avx512bw", "avx512")):
            if self._usable(flag):
                return isa, f"CPU has {flag}{self._capped()}"
        return "avx2", f"CPU has neither AVX512-VNNI nor AVX512BW{self._capped()}"

    # --- devices and runtimes ------------------------------------------------------------------------------------
    def cuda(self) -> Capability:
        return Capability(*self.fact("torch_cuda"))

    def cuda_bf16(self) -> Capability:
        if not self.cuda():
            return Capability(False, self.cuda().why)
        return Capability(*self.fact("cuda_bf16"))

    def ort_cuda(self) -> Capability:
        if not self.cuda():
            return Capability(False, self.cuda().why)
        return Capability(*self.fact("ort_cuda"))

    def openvino(self) -> Capability:
        ok, detail = self.fact("openvino")
        return Capability(ok, "OpenVINO compiles for this CPU" if ok else detail)

    def openvino_bf16(self) -> Capability:
        """OpenVINO reports bf16 on CPUs where it only emulates it, and ignores the ISA cap: both it and the CPU
        must say yes."""
        if not self.openvino():
            return self.openvino()
        if not self.cpu_bf16():
            return Capability(False, self.cpu_bf16().why)
        ok = "BF16" in self.fact("openvino")[1].split(",")
        return Capability(ok, "OpenVINO and the CPU run bf16" if ok else "OpenVINO reports no BF16 for this CPU")

    def capabilities(self) -> dict[str, Capability]:
        return {"cpu_bf16": self.cpu_bf16(), "amx": self.amx(), "cuda": self.cuda(), "cuda_bf16": self.cuda_bf16(),
                "onnxruntime_cuda": self.ort_cuda(), "openvino": self.openvino(),
                "openvino_bf16": self.openvino_bf16()}


@functools.lru_cache(maxsize=1)
def _this_machine() -> Machine:
    info = _cpuinfo()
    cap = (os.environ.get(ISA_CAP_ENV) or "").upper() or None
    return Machine(arch=_arch(), cpu=_cpu_model(info), flags=_cpu_flags(info),
                   isa_cap=None if cap in (None, "DEFAULT", "ALL") else cap)


def probe() -> Machine:
    """This machine (probed once per process; expensive facts on first use)."""
    return _this_machine()


# --- choices that depend on the machine ------------------------------------------------------------------------------
PRECISIONS = ("fp32", "bf16", "auto")


def decoder_precision(precision: str, device: str = "cpu") -> tuple[str, str]:
    """(precision, why) a decoder reads in: "auto" -> bf16 on a GPU that computes in bf16 or a CPU with AMX /
    AVX512-BF16 (about 3x fp32 with AMX, about even without), else fp32; "bf16" asked for on a machine without bf16
    falls back to fp32 (autocast would emulate it, slower than fp32) and says so."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32":
        return "fp32", "asked for"
    has = probe().cuda_bf16() if device.startswith("cuda") else probe().cpu_bf16()
    if has:
        return "bf16", f"{'asked for' if precision == 'bf16' else 'auto'}: {has.why}"
    return "fp32", f"bf16 does not run here: {has.why}"


def training_precision(precision: str) -> tuple[str, str]:
    """(precision, why) of a fine-tuning run: fp16 / bf16 apply on CUDA only, bf16 only on a GPU that has it."""
    machine = probe()
    if precision == "fp32":
        return "fp32", "asked for"
    if not machine.cuda():
        return "fp32", f"{precision} needs CUDA: {machine.cuda().why}"
    if precision == "bf16" and not machine.cuda_bf16():
        return "fp32", f"bf16 does not run here: {machine.cuda_bf16().why}"
    return precision, f"asked for, on {machine.cuda().why}"


def describe(choices: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a run or benchmark ran on: CPU model, cores, the flags that decide precision and int8 settings, the ISA
    cap, what runs here and why, and the ``choices`` made from it."""
    machine = probe()
    isa, isa_why = machine.int8_isa()
    record = {"cpu": machine.cpu, "arch": machine.arch, "cores": os.cpu_count(),
              "matmul_flags": [f for f in MATMUL_FLAGS if f in machine.flags], "isa_cap": machine.isa_cap,
              "int8_isa": {"value": isa, "why": isa_why},
              "capabilities": {name: c.as_dict() for name, c in machine.capabilities().items()},
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "python": platform.python_version()}
    if choices:
        record["choices"] = dict(choices)
    return record


def cpu_model() -> str:
    return probe().cpu


def matmul_flags() -> list[str]:
    """This CPU's flags among ``MATMUL_FLAGS`` (as the CPU reports them, before any ISA cap)."""
    return [f for f in MATMUL_FLAGS if f in probe().flags]


def default_ds_accelerator() -> None:
    """Call before transformers loads a model or a tokenizer. That imports DeepSpeed (through accelerate), which probes
    for an accelerator and, finding none, logs "Setting accelerator to CPU ..." at WARNING: a line a user can do
    nothing about. Where no CUDA device runs, name the CPU for it (``DS_ACCELERATOR``) unless the user set one; with
    CUDA, DeepSpeed detects it as before."""
    if "DS_ACCELERATOR" in os.environ or "deepspeed" in sys.modules:
        return
    if not probe().cuda():
        os.environ["DS_ACCELERATOR"] = "cpu"
