"""Export: a trained judge as ONNX, refused unless it passes the parity gate against PyTorch. ``onnx``:
``export_judge``, which hands the caller's ``options.ExportOptions`` to the exporter of the judge's kind
(``kinds.EXPORTERS``): ``fine_tuned`` (a fine-tuned head: torch.onnx export, graph optimization, int8 / int4),
``embedding`` (an embedding judge's decoder reader), ``verdict`` (a verdict judge's graphs, one per question, fp32 and
int4). What every kind shares: ``gate`` (the parity gate, its thresholds in ``configs/parity.yaml``), ``quantize``
(int8 with per-ISA settings, weight-only int4), ``graph`` (a sequence-classification model's graph and its
optimizers), ``directory`` (where an export is written), ``signature`` and ``shared_weights``."""
