"""Export: a trained judge as ONNX, refused unless it passes the parity gate against PyTorch. ``onnx``: fine-tuned
heads (``export_judge``: torch.onnx export, graph optimization, int8 with per-ISA settings, the parity gate with
its thresholds in ``configs/parity.yaml``; ``EXPORTERS`` for other kinds); ``embedding``: an embedding judge's
decoder reader as one graph; ``verdict``: a verdict judge's graphs, one per question, fp32 and int4."""
