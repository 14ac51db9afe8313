"""What machine a run or benchmark ran on: CPU model, cores, the matmul extensions that decide its fastest
precision. Timings mean little without it (an AMX CPU reads the default judge about twice as fast as a CPU
without it)."""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

# /proc/cpuinfo flags that change which precision pays (embedders.decoder.resolve_precision)
MATMUL_FLAGS = ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx512f", "avx2")


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_model() -> str:
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def matmul_flags() -> list[str]:
    flags = next((line.split(":", 1)[1].split() for line in _cpuinfo().splitlines() if line.startswith("flags")), [])
    return [f for f in MATMUL_FLAGS if f in flags]


def describe() -> dict[str, Any]:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "matmul_flags": matmul_flags(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "python": platform.python_version()}


def default_ds_accelerator() -> None:
    """Call before transformers loads a model or a tokenizer. That imports DeepSpeed (through accelerate), which probes
    for an accelerator and, finding none, logs "Setting accelerator to CPU ..." at WARNING: a line a user can do
    nothing about. Where torch sees no CUDA device, name the CPU for it (``DS_ACCELERATOR``) unless the user set
    one; with CUDA, DeepSpeed detects it as before."""
    if "DS_ACCELERATOR" in os.environ or "deepspeed" in sys.modules:
        return
    try:
        import torch
    except ImportError:  # an ONNX-only install: transformers imports neither accelerate nor DeepSpeed without torch
        return
    if not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
