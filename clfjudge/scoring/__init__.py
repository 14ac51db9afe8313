"""Batch scoring: a file of pairs or answers through a judge, streamed, resumable, every line accounted for.

``local`` scores in this process (``clfjudge score --engine local``), ``ray_engine`` on judge actors of a Ray
cluster (``--engine ray``, the ray extra); both read lines into records and write results the same way
(``batch``), and the local engine's files and progress live in ``files``.
"""
