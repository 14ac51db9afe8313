"""Judges: what answers ``compare`` / ``score`` / ``rank``. ``base``: ``Judge`` (``Judge.load(dir)`` opens any
kind through the loader of its card's kind and backend, ``kinds.find_loader``), ``Comparison``, ``Score``; one
module per kind: ``model`` (a fine-tuned head on PyTorch or ONNX), ``embedding`` (a frozen embedder + a
scikit-learn head, with its ``features`` and pickle-free ``linear_head``), ``generative`` (a causal LM writes its
verdict); and ``calibration`` (temperature, tie margin) fitted on labelled pairs and stored in the judge card."""
