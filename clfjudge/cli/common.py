"""What several sub-commands of the `clfjudge` CLI share (each sub-command: clfjudge/cli/<name>.py)."""
from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

    from ..batching import Budget
    from ..options import LoadOptions
    from ..scoring.ray_engine import RayOptions


TRUST_PICKLE_HELP = ("load pickles a judge directory holds: a head an older clfjudge saved as head.joblib, or a "
                     "pytorch_model.bin that holds more than tensors: unpickling runs whatever code the file holds, "
                     "so only for directories you trust; re-save (or convert to safetensors) to drop the pickle")


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high`` (None: no bound), else argparse's usage error."""

    def integer(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: it must be {bound}")
        return value

    return integer


THREADS = int_in(1)


@contextlib.contextmanager
def stopped_like_ctrl_c() -> Iterator[None]:
    """Inside: SIGTERM (``kill``, a job scheduler stopping the job) ends the command as Ctrl-C does, by an exception,
    so what it cleans up on the way out (an export's hidden temporary folder) is cleaned; the default, an immediate
    end, would leave it. Either signal is also remembered (``progress.stop``): one whose exception Python swallowed
    (raised inside a finalizer, which a signal pending through a long native call often lands in) is raised again at
    the next progress report. The previous handlers are restored after."""
    from .. import progress

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set a handler
        yield
        return

    def stop(signum, frame):
        progress.stop(signum)
        raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        progress.stop(None)


def local_inputs(specs: Sequence[str], role: str) -> list[tuple[str, Path]]:
    """The local files a command reads from its data or judge specs (``"name"``, ``"name:N"``, a path, hf:...):
    each file, and each file of a directory, as inputs of ``outputs.check_apart``."""
    from ..data.sources import parse_source
    from ..outputs import files_of

    found: list[tuple[str, Path]] = []
    for spec in specs:
        path = Path(spec)
        if not path.exists():
            with contextlib.suppress(ValueError):
                path = Path(parse_source(spec)[0])
        if path.is_dir():
            found += files_of(path, f"a file of {role} {spec}")
        elif path.is_file():
            found.append((role, path))
    return found


def add_trust_pickle(parser) -> None:
    parser.add_argument("--trust-pickle", action="store_true", help=TRUST_PICKLE_HELP)


def add_data_options(parser) -> None:
    """How the user's own data files (data specs) a command reads are read: ``data.formats``."""
    g = parser.add_argument_group("your data", "a path to JSONL / JSON / Parquet / CSV, a save_to_disk directory or "
                                               "hf:OWNER/NAME[:SPLIT]: its format is detected from the columns")
    g.add_argument("--format", default=None,
                   help="force the format: trl, pairwise, clfjudge, pointwise, feedback-collection, completion, "
                        "messages (clfjudge.data.formats.FORMATS)")
    g.add_argument("--columns", default=None, metavar="FIELD=COLUMN[,...]",
                   help="columns named differently, e.g. question=prompt,answer_a=response_1,winner=label")
    g.add_argument("--scale", default=None, metavar="LO,HI", help="the score scale of pointwise ratings (default 1,5)")


def read_options(args: argparse.Namespace):
    from ..data.formats import ReadOptions

    return ReadOptions.make(args.format, args.columns, args.scale)


def add_model_input(parser) -> None:
    from ..prompts.model_input import INPUTS

    parser.add_argument("--model-input", default=None, choices=INPUTS.names(),
                        help="for a reward model without a judge card: how it reads (question, answer) (default: "
                             "trl for a decoder with a chat template, as TRL's GRPOTrainer: the template over a "
                             "prompt given as messages, a plain-text prompt and its answer as one text; text-pair for "
                             "encoders; docs/your-model.md)")


def add_provider(parser) -> None:
    from ..models.onnx_session import AUTO, PROVIDERS

    parser.add_argument("--provider", default=AUTO, choices=[AUTO, *PROVIDERS.names()],
                        help="what runs an ONNX judge: auto (the fastest run its export's parity gate passed, where "
                             "this machine has it; else cpu), onnxruntime (cpu, cuda) or OpenVINO (openvino: f32, "
                             "openvino-bf16: only where clfjudge export --provider gated it; the openvino extra)")


class _DeprecatedAlias(argparse.Action):
    """An old spelling of an option, kept working for scripts and hidden from --help: it says which to use."""

    def __init__(self, option_strings, dest, new: str, **kwargs) -> None:
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        import sys

        print(f"clfjudge: {option_string} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_batch_size(parser, default: int, help: str, alias: str | None = None) -> None:
    """``--batch-size``, the one name of how many records a judge call takes (``Judge.load(batch_size=...)``);
    ``alias``: an older spelling of it, still accepted."""
    parser.add_argument("--batch-size", type=int, default=default, help=help)
    if alias:
        parser.add_argument(alias, type=int, dest="batch_size", action=_DeprecatedAlias, new="--batch-size")


def add_recipe(parser, help: str, required: bool = True, **kwargs) -> None:
    """``--recipe``, the one name of a training recipe file (``train``, ``run``, ``distill``); ``--config``, its
    older spelling, is still accepted."""
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--recipe", help=help, **kwargs)
    group.add_argument("--config", dest="recipe", action=_DeprecatedAlias, new="--recipe",
                       **{k: v for k, v in kwargs.items() if k == "type"})


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
    """``clfjudge.scoring.ray_engine`` (which imports Ray), or a ValueError saying how to install it."""
    try:
        from ..scoring import ray_engine
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


def judge_options(p: argparse.ArgumentParser, batch_size: int | None = None,
                  batch_help: str = "records per judge call (and forward pass)", alias: str | None = None) -> None:
    """How a command that runs one judge loads it (score, calibrate, serve): one option per field of
    ``options.LoadOptions`` a user sets, read back by ``load_options``; ``batch_size``: the command's default
    (None: ``batching.DEFAULT_BATCH_SIZE``); ``alias``: an older spelling of ``--batch-size``."""
    from ..batching import DEFAULT_BATCH_SIZE

    p.add_argument("--backend", default="auto",
                   help="auto (what the judge card names, else what the directory holds) or a loader: torch, onnx, "
                        "sklearn, generate, or one registered in clfjudge.kinds")
    add_provider(p)
    p.add_argument("--variant", default=None, help="ONNX file: fp32 | optimized | int8 | a file name "
                                                   "(default: the card's primary)")
    p.add_argument("--threads", type=THREADS, default=None, help="intra-op threads of the backend")
    add_batch_size(p, batch_size or DEFAULT_BATCH_SIZE, batch_help, alias)
    add_trust_pickle(p)
    add_model_input(p)


def load_options(args: argparse.Namespace, budget: Budget | None = None, **changes) -> LoadOptions:
    """The ``LoadOptions`` of the load options a command declares (``judge_options``; audit's ``--trust-pickle``),
    the others at their defaults, built once here and passed down; ``budget``: the caller's (default:
    ``--batch-size`` rows, where the command has it); ``changes``: what the command fixes."""
    from dataclasses import fields

    from ..batching import Budget
    from ..options import LoadOptions

    given = {f.name: getattr(args, f.name) for f in fields(LoadOptions)
             if f.name != "budget" and hasattr(args, f.name)}
    if budget is None and hasattr(args, "batch_size"):
        budget = Budget(args.batch_size)
    return LoadOptions(**given, **({"budget": budget} if budget else {})).with_(**changes)
