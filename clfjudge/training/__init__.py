"""Training: what one run is (``config``: ``TrainConfig`` with help on every key, the Table 7 presets, the lazy
``TRAINERS`` registry of heads another loop trains), the data every trainer shares (``data``: sources -> held-out
fold, decontamination, dev split, mixing, augmentation), and one module per trainer: ``trainer`` (``train(cfg)``:
dispatch, and the HF ``Trainer`` loop of the fine-tuned heads), ``embedding`` (frozen encoder + scikit-learn head)
and ``generative`` (the LM head writes the judgement)."""
