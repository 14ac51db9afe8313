"""Serving: a loaded judge in use. ``server``: the HTTP API (Starlette; API key, validation, bounded queue,
dynamic batching, ``/metrics``); ``reward``: a TRL-style reward function and best-of-n for training loops."""
