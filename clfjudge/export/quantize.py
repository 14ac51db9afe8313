"""The quantizers every kind's export shares: dynamic int8 with the CPU instruction set's settings
(clfjudge/configs/int8.yaml: ``int8_settings``, ``quantize_onnx``) and weight-only int4 (onnxruntime's
MatMulNBits: ``quantize_int4``). Each writes a new file beside the one it reads and returns what it did, for the
card and the parity report; the parity gate (``export.gate``) then decides whether the lossy file is kept."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..configs import config_path
from . import quiet

if TYPE_CHECKING:
    import onnx

INT8_CONFIG = config_path("int8.yaml")


@dataclass(frozen=True)
class Int8Settings:
    """``quantize_dynamic`` settings for one CPU instruction set (see clfjudge/configs/int8.yaml)."""

    isa: str
    weight_type: str = "QInt8"
    per_channel: bool = False
    reduce_range: bool = False
    op_types: tuple[str, ...] = ("MatMul", "Gemm")
    fp32_inputs_from: tuple[str, ...] = ()  # weight products whose input an op of these types makes stay fp32
    fp32_name_patterns: tuple[str, ...] = ()  # nodes whose name contains one of these stay fp32 (e.g. down_proj)


def cpu_isa() -> str:
    """The int8 instruction set of this machine (``machine.Machine.int8_isa``): avx512_vnni | avx512 | avx2 | arm64."""
    from ..machine import probe

    return probe().int8_isa()[0]


def int8_settings(isa: str = "auto", path: str | Path = INT8_CONFIG) -> Int8Settings:
    import yaml

    path = Path(path)
    table = (yaml.safe_load(path.read_text()) or {}).get("isa") or {}
    name = cpu_isa() if isa == "auto" else isa
    if name not in table:
        raise ValueError(f"{path}: no int8 settings for ISA {name!r} (has {sorted(table)})")
    values = dict(table[name] or {})
    for key in ("op_types", "fp32_inputs_from", "fp32_name_patterns"):
        if key in values:
            values[key] = tuple(values[key])
    known = {f.name for f in fields(Int8Settings)} - {"isa"}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"{path}: isa.{name}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    return Int8Settings(isa=name, **values)


def fp32_nodes(model: onnx.ModelProto, producer_types: Sequence[str]) -> list[str]:
    """Names of the nodes whose first input is produced by an op of one of ``producer_types``."""
    producer = {out: node.op_type for node in model.graph.node for out in node.output}
    return [node.name for node in model.graph.node
            if node.input and producer.get(node.input[0]) in set(producer_types)]


def quantize_onnx(src: Path, dst: Path, settings: Int8Settings, external: bool = False) -> dict[str, Any]:
    """Dynamic int8 quantization. Stale ``value_info`` from the dynamo exporter breaks the quantizer's shape
    inference, so it is cleared first; DefaultTensorType covers fused (optimized) nodes without type info."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src))
    model.graph.ClearField("value_info")
    prepared = dst.with_name(dst.stem + ".prepared.onnx")
    # named after the prepared file, so that the cleanup below finds it (onnx's default name is a random uuid)
    onnx.save(model, str(prepared), save_as_external_data=external, all_tensors_to_one_file=True,
              location=prepared.name + ".data")
    excluded = fp32_nodes(model, settings.fp32_inputs_from)
    excluded += [n.name for n in model.graph.node if n.name not in excluded
                 and any(p in n.name for p in settings.fp32_name_patterns)]
    try:
        with quiet.quantization():
            quantize_dynamic(str(prepared), str(dst), weight_type=QuantType[settings.weight_type],
                             per_channel=settings.per_channel, reduce_range=settings.reduce_range,
                             op_types_to_quantize=list(settings.op_types), nodes_to_exclude=excluded,
                             use_external_data_format=external,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        for leftover in dst.parent.glob(prepared.name + "*"):
            leftover.unlink()
    return {"quantization": "dynamic", **asdict(settings), "fp32_nodes": len(excluded)}


def quantize_int4(src: Path, dst: Path, block_size: int = 32, nodes_to_exclude: Sequence[str] = ()) -> dict[str, Any]:
    """Weight-only int4 (onnxruntime's MatMulNBits, symmetric blocks of ``block_size`` along each weight's input
    axis; accuracy level 4: the activations meet the weights in int8, as the CPU kernels are fastest). ``dst`` keeps
    its tensors in ``dst.name + ".data"``."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, accuracy_level=4)
    with quiet.quantization():
        quantizer = MatMulNBitsQuantizer(onnx.load(str(src)), nodes_to_exclude=list(nodes_to_exclude),
                                         algo_config=config)
        quantizer.process()
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=True)
    return {"quantization": "weight-only int4 (MatMulNBits)", "block_size": block_size, "symmetric": True,
            "accuracy_level": 4, "fp32_nodes": len(nodes_to_exclude)}
