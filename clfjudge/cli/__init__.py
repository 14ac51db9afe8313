"""The `clfjudge` entry point: each sub-command lives in clfjudge/cli/<name>.py and exposes
``register(subparsers)``; heavy libraries are imported only when a command runs."""
from __future__ import annotations

import argparse
import importlib
import sys

# One line per command module; each adds its own sub-parser(s).
COMMAND_MODULES = [
    "data",
    "models",
    "train",
    "label",
    "distill",
    "export",
    "score",
    "calibrate",
    "serve",
    "audit",
    "run",
]


DESCRIPTION = """\
clfjudge trains classifier judges for LLM evaluation (a classification, regression or reward head on an
encoder or decoder), exports them to ONNX behind a parity gate, scores and serves them (batch files, HTTP, a
reward function for RLHF and best-of-n) and audits how far a judge generalizes, beside "longer answer wins"
and "shorter answer wins".

Start with `clfjudge run` (train, export and audit the default judge), or `clfjudge train`, `clfjudge export
JUDGE_DIR`, `clfjudge score JUDGE_DIR`, `clfjudge serve JUDGE_DIR` and `clfjudge audit JUDGE_DIR`; each has
--help."""


USER_ERRORS = (FileNotFoundError, ValueError, KeyError)  # a user's mistake: one clear line, non-zero exit

# The exit statuses every command shares (docs/scoring.md lists them); 1 is a command's own partial failure
# (clfjudge score: some lines rejected; clfjudge run: a step failed).
EXIT_USAGE = 2  # a usage or input error: argparse's, a missing file, a bad line or option, an output that is an input
EXIT_JUDGE = 3  # the judge cannot be loaded or cannot score (judges.base.JudgeError): before any input, or mid-run
EXIT_OS = 4  # a file could not be read or written: a directory where a file goes, permissions, a full disk
EXIT_LISTEN = 5  # clfjudge serve cannot listen on its address (in use, not this machine's), before the judge loads


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage errors in one line (exit status 2), as every other usage error; the sub-parsers
    are of this class too (argparse makes them of their parent's)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="clfjudge", description=DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def os_error_line(exc: OSError) -> str:
    """An OS error as one line: the file(s) it names, then the system's reason."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    cause = exc.strerror or str(exc)
    return f"{where}: {cause}" if where else cause


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as exc:  # user errors: one clear line, non-zero exit
        # str(KeyError) is the repr of its message (quoted); the message itself reads better
        message = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 else exc
        if isinstance(exc, FileNotFoundError) and exc.strerror:
            message = os_error_line(exc)
        print(f"clfjudge: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"clfjudge: error: {os_error_line(exc)}", file=sys.stderr)
        return EXIT_OS
    except Exception as exc:
        from ..judges.base import JudgeError  # imported only when something failed: the CLI starts without it
        from ..serving.listen import CannotListen

        if not isinstance(exc, (JudgeError, CannotListen)):
            raise
        print(f"clfjudge: error: {exc}", file=sys.stderr)
        return EXIT_LISTEN if isinstance(exc, CannotListen) else EXIT_JUDGE


if __name__ == "__main__":
    sys.exit(main())
