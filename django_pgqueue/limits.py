"""Bounds of the free-text and numeric job fields, shared by the models and validation."""

from __future__ import annotations

QUEUE_MAX_LENGTH = 100
TASK_PATH_MAX_LENGTH = 255
KEY_MAX_LENGTH = 255
WORKER_ID_MAX_LENGTH = 200
MAX_ATTEMPTS_LIMIT = 1000
# Job ids are bigint: ids outside this range are refused before PostgreSQL sees them.
JOB_ID_MIN = -(2**63)
JOB_ID_MAX = 2**63 - 1
