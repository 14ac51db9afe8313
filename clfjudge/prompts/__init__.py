"""Prompts: a record becomes judge input here. Schemes as data (``schemes`` + ``templates/*.yaml``), per-field
truncation to a token budget (``truncation``), the one record -> token ids path of training and inference
(``encoding``), and the released judges' output parsers (``parsers``)."""
