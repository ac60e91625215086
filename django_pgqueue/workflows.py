"""Documented import path of chains and groups.

The code lives in :mod:`django_pgqueue.features.workflows`; this module only re-exports it.
"""

from django_pgqueue.features.workflows import Step, chain, group, step

__all__ = ["Step", "chain", "group", "step"]
