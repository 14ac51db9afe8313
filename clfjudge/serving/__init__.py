"""Serving: a loaded judge in use. ``server``: the HTTP API (Starlette; API key, validation, bounded queue,
dynamic batching, ``/metrics``); ``listen``: the socket it listens on and the guards on its connections (head
timeout, connection cap, logs once per cause); ``openapi``: its OpenAPI document; ``reward``: a TRL-style reward
function and best-of-n for training loops."""
