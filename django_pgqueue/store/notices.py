"""Lease notices: the channel that tells a worker at once it no longer owns a job.

An operator's cancel of a running job and the reaper's recovery of an expired lease each
send one notice per job they took away (never on the hot path: completions, failures and
claims send none). The payload is a small JSON object naming the worker, the job and the
lease generation the worker held, so a worker acts only on its own attempt: a notice
about an older generation of a job it has since claimed again matches nothing.

A notice is a hint. A worker that misses it (its LISTEN connection was down) learns the
same at its next heartbeat, whose lease extension no longer finds the lease.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from django_pgqueue.conf import conf

__all__ = ["LeaseNotice", "flow_channel", "lease_channel", "parse_notice"]

# PostgreSQL refuses channel names of 64 bytes or more; the suffix must survive.
_SUFFIX = "_leases"
_FLOW_SUFFIX = "_flow"
_MAX_CHANNEL = 63


def lease_channel() -> str:
    """Return the channel lease notices are sent on (derived from PGQUEUE_NOTIFY_CHANNEL)."""
    return conf.NOTIFY_CHANNEL[: _MAX_CHANNEL - len(_SUFFIX)] + _SUFFIX


def flow_channel() -> str:
    """Return the channel that says a concurrency key can start a job again.

    Its payload names the queue, as on the wake-up channel. A worker told there claims
    with the statement that reads partitions and keys; a plain wake-up only tells it a
    plain job arrived (see ``QueueStore.claim_round``). The settling trigger of
    migration 0015 derives the same name in SQL: keep the two rules alike.
    """
    return conf.NOTIFY_CHANNEL[: _MAX_CHANNEL - len(_FLOW_SUFFIX)] + _FLOW_SUFFIX


@dataclass(frozen=True, slots=True)
class LeaseNotice:
    """One lease taken away from a worker."""

    worker_id: str
    job_id: int
    lease_generation: int
    #: "cancelled" (an operator cancelled the running job) or "reaped" (the lease expired).
    reason: str


def parse_notice(payload: str) -> LeaseNotice | None:
    """Return the notice in ``payload``; None if it is not one (never raises)."""
    try:
        data = json.loads(payload)
        worker, job, generation, reason = (
            data["worker"],
            data["job"],
            data["generation"],
            data["reason"],
        )
    except (ValueError, TypeError, KeyError):
        return None
    if not (isinstance(worker, str) and isinstance(reason, str)):
        return None
    if not (isinstance(job, int) and isinstance(generation, int)):
        return None
    return LeaseNotice(worker_id=worker, job_id=job, lease_generation=generation, reason=reason)
