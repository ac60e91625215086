"""What a failed attempt leaves in the job's history: class, message, traceback, as raised."""

from __future__ import annotations

import traceback

from django_pgqueue.exceptions import InvalidArguments, JobCancelled, PermanentError
from django_pgqueue.store.values import Failure

__all__ = ["ARGUMENTS_MISMATCH", "cancelled_failure", "failure_from"]

_MAX_MESSAGE = 10_000
_MAX_TRACEBACK = 50_000
# Set on a TypeError raised because a job's arguments do not bind to its task: the error
# is recorded as it is, but retrying it cannot help.
ARGUMENTS_MISMATCH = "_pgqueue_arguments_mismatch"


def cancelled_failure(what: str) -> Failure:
    """Describe an attempt stopped by an operator's cancel, for the job's history."""
    return Failure(
        exception_class=f"{JobCancelled.__module__}.{JobCancelled.__qualname__}",
        message=f"cancelled by an operator while it ran; {what}",
        permanent=True,
    )


def failure_from(error: BaseException, *, permanent: bool = False) -> Failure:
    """Describe ``error`` for the job's history, as it was raised.

    Never raises: an exception whose ``__str__`` fails is recorded with its own class
    and a placeholder message. Permanent (no retry): ``permanent``, a
    :class:`PermanentError`, or arguments that do not bind (see ``JobRunner._explain``).
    """
    kind = type(error)
    message = _message_of(error)
    try:
        text = "".join(traceback.format_exception(error))
    except Exception:  # a broken exception must not hide the failure
        text = f"{kind.__module__}.{kind.__qualname__}: {message}"
    return Failure(
        exception_class=f"{kind.__module__}.{kind.__qualname__}",
        message=message[:_MAX_MESSAGE],
        traceback=text[-_MAX_TRACEBACK:],
        permanent=permanent
        or isinstance(error, PermanentError | InvalidArguments)
        or getattr(error, ARGUMENTS_MISMATCH, False),
    )


def _message_of(error: BaseException) -> str:
    try:
        return str(error) or repr(error)
    except Exception as broken:  # recorded in the placeholder
        return f"<str() of the exception failed: {type(broken).__name__}>"
