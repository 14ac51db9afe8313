"""`clfjudge export JUDGE_DIR --out DIR [--preset export/NAME.yaml] [--int8] [--int4] [--optimize] [--opset N]
[--provider NAME] [--openvino VARIANT] [--obvious SOURCE]`: ONNX export behind a parity gate."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import add_model_input, add_trust_pickle, stopped_like_ctrl_c


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("export", help="export a judge or a reward model to ONNX (fp32 / optimized / "
                                             "int8 / int4), refused unless it decides as PyTorch on real records")
    p.add_argument("judge_dir", metavar="JUDGE_DIR",
                   help="a trained judge directory (HF model + judge_card.json), or a reward model without a card "
                        "(a sequence-classification model's directory or hf:OWNER/NAME[@REV]: docs/your-model.md)")
    p.add_argument("--out", required=True, help="new directory for the ONNX judge (must not exist or be empty)")
    p.add_argument("--int8", action="store_true",
                   help="also write a dynamic int8 copy (model_quantized.onnx; an embedding judge's "
                        "reader_quantized.onnx; a verdict judge's beside its OpenVINO variants), the primary where "
                        "the gate passes it")
    p.add_argument("--int4", action=argparse.BooleanOptionalAction, default=None,
                   help="also write a weight-only int4 copy (MatMulNBits: model_int4.onnx; an embedding judge's "
                        "reader_int4.onnx), the primary where the gate passes it (after int8); a verdict judge "
                        "writes one unless --no-int4")
    p.add_argument("--fallback", "--int8-fallback", dest="fallback", action="store_true",
                   help="if the gate refuses only lossy runs (int8, int4, a bf16 --provider) but passes fp32, write "
                        "what passed and say by how much the others missed (as make main)")
    p.add_argument("--optimize", action="store_true", help="also write model_optimized.onnx (onnxruntime fusions)")
    p.add_argument("--provider", dest="providers", action="append", default=[], metavar="NAME",
                   help="also gate the fp32 file as this provider runs it (repeatable): openvino (f32), "
                        "openvino-bf16 (needs the openvino extra); a bf16 provider loads only where it passed")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's)")
    p.add_argument("--isa", default="auto", help="int8 settings from clfjudge/configs/int8.yaml: auto (this CPU), "
                                                 "avx512_vnni, avx512, avx2, arm64")
    p.add_argument("--source", default=None, metavar="NAME[:N]",
                   help="validation source of the parity gate (default: the card's sources, then "
                        "clfjudge/configs/parity.yaml's)")
    p.add_argument("--n", dest="n_records", type=int, default=None, help="validation records (default: parity.yaml)")
    p.add_argument("--parity-config", default=None,
                   help="parity thresholds YAML (default: clfjudge/configs/parity.yaml)")
    p.add_argument("--threshold", dest="thresholds", action="append", default=[], metavar="PRECISION.KEY=VALUE",
                   help="override a parity threshold, e.g. --threshold int8.min_agreement=0.98 (repeatable)")
    p.add_argument("--openvino", action="append", default=None, metavar="VARIANT",
                   help="a verdict judge's OpenVINO IR variant to make and gate where this machine can (repeatable): "
                        "ov-int8-weights, ov-int4-weights, ov-int8 (int8 weights and activations), ov-int8-mixed "
                        "(ov-int8 with the MLPs' down projections left unquantized); none for none "
                        "(default: the first three)")
    p.add_argument("--obvious", default=None, metavar="SOURCE",
                   help="a verdict judge's obvious pairs (a source name or a data file): every lossy run must decide "
                        "each of them as fp32 does")
    add_model_input(p)
    add_trust_pickle(p)
    p.add_argument("--preset", default=None, metavar="PRESET.yaml",
                   help="export options from a YAML preset (the repository's export/*.yaml: fp32, int8 per ISA, "
                        "int4, OpenVINO bf16, CUDA); options given here override it")
    p.set_defaults(func=run, option_defaults={a.dest: a.default for a in p._actions})


def _print_variants(report: dict[str, Any], stream) -> None:
    """One line per run through the gate, the runs a fallback left out (``refused``) included."""
    val = report["validation"]
    print(f"parity on {val['n']} records of {val['source']} (batch {val['batch_size']}):", file=stream)
    refused = (report.get("refused") or {}).get("variants", {})
    for name, v in {**report["variants"], **refused}.items():
        status = "refused, left out" if name in refused else "ok" if v["passed"] else "FAILED"
        if "max_abs_diff" not in v:  # never measured: the runtime could not run the file
            print(f"  {name:32s} {v['precision']:5s} {'; '.join(v.get('failures') or [])}  {status}", file=stream)
            continue
        cosine = f"cosine {v['min_cosine']:.4f}  " if "min_cosine" in v else ""  # embedding judges' vectors
        print(f"  {name:32s} {v['precision']:5s} max|diff| {v['max_abs_diff']:.3g}  {cosine}agreement "
              f"{v['agreement']:.2%}  {v['metric']} {v['metric_onnx']:.4f} (torch {v['metric_reference']:.4f}, "
              f"delta {v['metric_delta']:+.4f})  {status}", file=stream)


def run(args: argparse.Namespace) -> int:
    from .. import progress
    from ..export.gate import ParityError, served
    from ..export.onnx import export_judge
    from ..export.options import ExportOptions
    from ..export.parity import PARITY_CONFIG, ParityConfig
    from ..export.presets import apply_preset, load_preset
    from ..judges.base import open_judge
    from ..outputs import check_apart, target

    check_apart({"JUDGE_DIR": args.judge_dir}, {"--out": args.out})
    args.out = target(args.out)  # a symlink to a folder: the folder is written, the link stays

    if args.preset:
        taken = apply_preset(args, load_preset(args.preset), args.option_defaults)
        print(f"preset {args.preset}: {', '.join(f'{k}={getattr(args, k)}' for k in taken) or 'nothing'} "
              "(options given on the command line kept)")
    options = ExportOptions(
        int8=args.int8, int4=args.int4, optimize=args.optimize, opset=args.opset, isa=args.isa, source=args.source,
        n_records=args.n_records, parity=ParityConfig.load(args.parity_config or PARITY_CONFIG, args.thresholds),
        fallback=args.fallback, providers=tuple(args.providers), model_input=args.model_input,
        trust_pickle=args.trust_pickle, obvious=args.obvious,
        openvino=None if args.openvino is None else tuple(name for name in args.openvino if name != "none"))
    open_judge(args.judge_dir, args.model_input)  # a directory that cannot be opened is the judge's fault (exit 3)
    try:
        # a stopped export removes its temporary folder; the meter shows the steps and answers read as they go
        with stopped_like_ctrl_c(), progress.meter("export"):
            result = export_judge(args.judge_dir, args.out, options)
    except ParityError as exc:
        _print_variants(exc.report, sys.stderr)
        raise
    _print_variants(result.report, sys.stdout)
    if result.report.get("refused"):
        print(result.report["refused"]["reason"], file=sys.stderr)
    exported, fastest = result.report["export"], served(result.report)
    print(f"exporter {exported['exporter']} (opset {exported['opset']}); primary {result.primary}; served (fastest "
          f"that passed): {fastest['file']} on {fastest['provider']}, {fastest['records_per_s']} records/s")
    print(result.out_dir)
    return 0
