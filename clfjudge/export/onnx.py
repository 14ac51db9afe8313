"""``export_judge``: a judge of any kind exported to ONNX behind the parity gate, by its kind's exporter
(``kinds.EXPORTERS``: ``export.fine_tuned``, ``export.embedding``, ``export.verdict``).

The options (``export.options.ExportOptions``) are built once, by the caller or from ``export_judge``'s keywords,
and handed whole to the exporter, which refuses what its kind cannot honour. A ``--provider`` that does not run on
this machine (``machine.probe``: no bf16 for openvino-bf16, no GPU for cuda) is left out here with a warning, never
an error, and the exported card's ``runtime.machine`` says what this machine could run and why.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .. import machine
from ..card import CARD_NAME, JudgeCard
from ..judges.base import open_card
from ..kinds import EXPORTERS, check_kind  # each kind's exporter (clfjudge/kinds.py)
from ..models.onnx_session import runnable_providers
from .directory import ExportResult
from .options import ExportOptions

log = logging.getLogger(__name__)


def export_judge(judge_dir: str | Path, out_dir: str | Path, options: ExportOptions | None = None,
                 **keywords: Any) -> ExportResult:
    """Export the judge (or a reward model without a card, ``judges.foreign``) at ``judge_dir`` into the new
    directory ``out_dir`` with ``options`` (``ExportOptions``; ``keywords``: its fields, set on top of them)."""
    options = ExportOptions.of(**keywords) if options is None else options.with_(**keywords)
    judge_dir, card = open_card(judge_dir, options.model_input)  # a model without a card is described
    kind = check_kind(card.kind, str(judge_dir / CARD_NAME))
    if kind not in EXPORTERS:
        raise ValueError(f"{judge_dir}: a {kind} judge has no ONNX export (the kinds that have "
                         f"one: {', '.join(map(str, EXPORTERS.names()))})")
    kept, skipped = runnable_providers(options.providers)
    for name, why in skipped.items():
        log.warning("provider %s is not gated: it does not run on this machine (%s)", name, why)
    # the native modules load before any exporter makes its temporary folder: a stop that lands inside their
    # import aborts the process (the exception cannot cross their C++ frames), so it must find no folder to leave
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401

    result = EXPORTERS.get(kind)(judge_dir, Path(out_dir), options.with_(providers=tuple(kept)))
    card = JudgeCard.load(result.out_dir)
    here = machine.probe()  # looked up now: tests simulate other machines
    isa, isa_why = here.int8_isa()
    card.runtime = {**card.runtime, "machine": {
        "cpu": here.cpu, "int8_isa": {"value": isa, "why": isa_why},
        "providers": {**{name: {"gated": True} for name in kept}, **{name: {"gated": False, "why": why}
                                                                    for name, why in skipped.items()}}}}
    card.save(result.out_dir)
    return result
