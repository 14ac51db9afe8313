"""`clfjudge data stats|show|overlap`: what the registered data sources hold, how a record is rendered,
and which evaluation questions also occur in other sets."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..data.sources import SOURCES
from .common import add_data_options, read_options

_STATS_COLUMNS = ("source", "arity", "role", "split", "records", "ties", "excluded", "median_answer_chars",
                  "available")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("data", help="data sources: statistics, rendered examples, overlaps")
    sub = parser.add_subparsers(dest="data_command", required=True)
    root_help = "data root (default: $CLFJUDGE_DATA or ../shared/data beside the repository)"

    stats = sub.add_parser("stats", help="one row per source and split: records, ties, exclusions, lengths")
    stats.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    stats.add_argument("--root", type=Path, help=root_help)
    stats.add_argument("--source", action="append", metavar="NAME",
                       help="only this source (repeatable): a built-in name or your own data (a file, a save_to_disk "
                            "directory, hf:OWNER/NAME[:SPLIT])")
    add_data_options(stats)
    stats.set_defaults(func=run_stats)

    show = sub.add_parser("show", help="print the first records of a source rendered in a scheme")
    show.add_argument("--source", metavar="NAME[:N]",
                      help="a source: " + ", ".join(SOURCES.names()) + "; or your own data (a file, a save_to_disk "
                           "directory, hf:OWNER/NAME[:SPLIT]); :N shows a seeded sample of N records, as everywhere")
    show.add_argument("name", nargs="?", help=argparse.SUPPRESS)  # the older spelling: data show NAME
    show.add_argument("--scheme", required=True, help="a registered scheme (clfjudge.prompts.schemes.SCHEMES)")
    show.add_argument("-n", type=int, default=2, help="how many records (default 2)")
    show.add_argument("--root", type=Path, help=root_help)
    show.add_argument("--path", type=Path, help="the source's file or directory (overrides --root)")
    add_data_options(show)
    show.set_defaults(func=run_show)

    overlap = sub.add_parser("overlap", help="questions of one source found in another (exact / line-set match)")
    overlap.add_argument("--json", action="store_true")
    overlap.add_argument("--root", type=Path, help=root_help)
    overlap.add_argument("--source", action="append", metavar="DATA",
                         help="also your own data (a file, a save_to_disk directory, hf:OWNER/NAME[:SPLIT]; "
                              "repeatable)")
    add_data_options(overlap)
    overlap.set_defaults(func=run_overlap)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _print_table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> None:
    cells = [tuple(map(str, header))] + [tuple(map(_cell, row)) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def run_stats(args: argparse.Namespace) -> int:
    from ..data.records import exclusion_lines
    from ..data.sources import parse_source, resolve
    from ..data.sources.stats import source_stats

    options = read_options(args)
    rows = [row for spec in (args.source or SOURCES.names())
            for name, limit in [parse_source(spec)]
            for row in source_stats(resolve(name, options), args.root, limit)]
    if args.json:
        print(json.dumps([row.as_dict() for row in rows], indent=2))
        return 0
    _print_table(_STATS_COLUMNS, [tuple(getattr(row, c) for c in _STATS_COLUMNS) for row in rows])
    print("median_answer_chars: median characters per answer (both answers of a pair); "
          "excluded: records dropped by the loader (by reason below, and in --json)")
    for row in rows:
        if row.sampled_from is not None:
            print(f"{row.source}: a seeded sample of {row.records} of its {row.sampled_from} usable records")
        for line in exclusion_lines(row.source, row.as_dict()):
            print(line)
    return 0


def run_show(args: argparse.Namespace) -> int:
    from ..data.records import exclusion_lines
    from ..data.sources import parse_source, resolve, sample
    from ..prompts.schemes import render  # another engineer's module; imported only when the command runs

    if (args.source is None) == (args.name is None):
        raise ValueError("data show: name the source once, with --source NAME")
    name, limit = parse_source(args.source or args.name)
    source = resolve(name, read_options(args))
    result = source.load(args.path if args.path is not None else source.path(args.root))
    for line in exclusion_lines(name, result.account()):
        print(line, file=sys.stderr)
    for record in sample(result.records, limit, name)[: args.n]:
        prompt = render(record, args.scheme)
        print(f"===== {record.id} =====\n{prompt}\n")
    return 0


def run_overlap(args: argparse.Namespace) -> int:
    from ..data.sources import resolve
    from ..data.splits import question_overlaps

    named = {name: source.load(source.path(args.root)).records
             for name, source in SOURCES.items() if source.available(args.root)}
    named.update({name: resolve(name, read_options(args)).load().records for name in args.source or ()})
    overlaps = question_overlaps(named)
    distinct = {name: len({r.question for r in records}) for name, records in named.items()}
    rows = [(b, a, exact, loose, distinct[b])
            for (a, b), (exact, loose) in sorted(overlaps.items(), key=lambda kv: kv[0][::-1])]
    if args.json:
        keys = ("questions_of", "found_in", "exact", "line_set_or_exact", "distinct_questions")
        print(json.dumps([dict(zip(keys, row)) for row in rows], indent=2))
        return 0
    _print_table(("questions of", "found in", "exact", "exact or line set", "distinct questions"), rows)
    return 0
