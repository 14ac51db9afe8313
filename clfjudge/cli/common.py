"""What several sub-commands of the `clfjudge` CLI share (each sub-command: clfjudge/cli/<name>.py)."""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

    from ..serving.ray_engine import RayOptions


TRUST_PICKLE_HELP = ("load a judge whose head an older clfjudge saved as a pickle (head.joblib): unpickling runs "
                     "whatever code the file holds, so only for directories you trust; re-save to drop the pickle")


def add_trust_pickle(parser) -> None:
    parser.add_argument("--trust-pickle", action="store_true", help=TRUST_PICKLE_HELP)


def add_model_input(parser) -> None:
    from ..prompts.model_input import INPUTS

    parser.add_argument("--model-input", default=None, choices=INPUTS.names(),
                        help="for a reward model without a judge card: how it reads (question, answer) (default: "
                             "chat-template for decoders, text-pair for encoders; docs/your-model.md)")


def add_provider(parser) -> None:
    from ..models.onnx_session import AUTO, PROVIDERS

    parser.add_argument("--provider", default=AUTO, choices=[AUTO, *PROVIDERS.names()],
                        help="what runs an ONNX judge: auto (the fastest run its export's parity gate passed, where "
                             "this machine has it; else cpu), onnxruntime (cpu, cuda) or OpenVINO (openvino: f32, "
                             "openvino-bf16: only where clfjudge export --provider gated it; the openvino extra)")


# -- --engine local | ray (clfjudge score, clfjudge audit) -------------------------------------------------------

def add_engine_options(parser: argparse.ArgumentParser, engines: Sequence[str], engine_help: str,
                       gpus_help: str = "GPUs each actor asks Ray for (e.g. 1, 0.5)") -> None:
    e = parser.add_argument_group("engine", "where the judge runs (pip install 'clfjudge[ray]' for --engine ray)")
    e.add_argument("--engine", default="local", choices=engines, help=engine_help)
    e.add_argument("--address", default=None,
                   help="Ray cluster to use: auto (the one `ray start` runs here), HOST:6379, or ray://HOST:10001 "
                        "(Ray Client: audit only, Ray Data does not run through it) (default: RAY_ADDRESS, else a "
                        "local Ray instance started for this run)")
    e.add_argument("--actors", type=int, default=None,
                   help="judge actors, each loading the judge once (default: one per CPU of the cluster, or per "
                        "GPU share with --gpus-per-actor)")
    e.add_argument("--gpus-per-actor", type=float, default=0.0, help=gpus_help)


def check_local_options(args: argparse.Namespace) -> None:
    """--engine local: the options of --engine ray are refused, not ignored."""
    ray_only = [f"--{k.replace('_', '-')}" for k, default in (("address", None), ("actors", None),
                                                                ("gpus_per_actor", 0.0))
                if getattr(args, k) != default]
    if ray_only:
        raise ValueError(f"{', '.join(ray_only)} applies to --engine ray")


def ray_engine() -> ModuleType:
    """``clfjudge.serving.ray_engine`` (which imports Ray), or a ValueError saying how to install it."""
    try:
        from ..serving import ray_engine
    except ImportError as exc:
        raise ValueError(f"--engine ray needs Ray Data: pip install 'clfjudge[ray]' ({exc})") from None
    return ray_engine


def ray_options(args: argparse.Namespace, cpus_per_actor: float = 1.0) -> RayOptions:
    """The --engine ray options (checked before Ray starts)."""
    if args.actors is not None and args.actors < 1:
        raise ValueError("--actors must be positive")
    if args.gpus_per_actor < 0:
        raise ValueError("--gpus-per-actor cannot be negative")
    return ray_engine().RayOptions(address=args.address, actors=args.actors, gpus_per_actor=args.gpus_per_actor,
                                   cpus_per_actor=cpus_per_actor)
