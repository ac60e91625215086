"""Text that PostgreSQL will store: what a worker records about an attempt it did not write.

Exception messages, class paths and tracebacks come from user code and third-party
libraries, so anything can be in them. PostgreSQL refuses NUL characters in ``text`` and
``jsonb``, refuses lone surrogates (they are not UTF-8), and ``last_error_class`` has a
column length. One refused string would fail the statement that records the outcome of
a whole batch; these functions make every string storable instead, marking what they
changed.
"""

from __future__ import annotations

from django_pgqueue.store.values import Failure

__all__ = ["TRUNCATED_MARK", "storable_failure", "storable_text"]

#: Appended to a string that was cut short.
TRUNCATED_MARK = "… [truncated]"
#: Stands in for a NUL character or a lone surrogate.
REPLACEMENT = "\ufffd"

MAX_CLASS_PATH = 255
MAX_MESSAGE = 10_000
MAX_TRACEBACK = 50_000


def storable_text(text: str, limit: int) -> str:
    """Return ``text`` without NUL characters or lone surrogates, at most ``limit`` long."""
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Surrogate pairs become their character; lone surrogates become U+FFFD.
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if len(text) > limit:
        text = text[: max(0, limit - len(TRUNCATED_MARK))] + TRUNCATED_MARK
    return text


def storable_failure(failure: Failure) -> Failure:
    """Return ``failure`` with every string storable (the traceback keeps its tail)."""
    traceback = failure.traceback
    if len(traceback) > MAX_TRACEBACK:
        # The end of a traceback says where it failed: keep that.
        traceback = TRUNCATED_MARK + traceback[-(MAX_TRACEBACK - len(TRUNCATED_MARK)) :]
    return Failure(
        exception_class=storable_text(failure.exception_class, MAX_CLASS_PATH),
        message=storable_text(failure.message, MAX_MESSAGE),
        traceback=storable_text(traceback, MAX_TRACEBACK),
        permanent=failure.permanent,
    )
