"""The retry backoff policy.

The delay is computed inside the failing UPDATE, on the database clock; this module holds
the policy's parameters and the same formula in Python, for documentation and tests::

    delay(attempt) = min(max_seconds, base_seconds * 2 ** (attempt - 1)) * (1 + jitter * u)

with ``u`` uniform in [-1, 1). The jitter spreads retries of jobs that failed together
(a database blip, an outage of a remote API) so they do not all come back at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from django_pgqueue.conf import conf

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Capped exponential backoff with proportional jitter."""

    base_seconds: float
    max_seconds: float
    jitter: float

    @classmethod
    def from_settings(cls) -> RetryPolicy:
        """Return the policy configured by the ``PGQUEUE_RETRY_*`` settings."""
        return cls(conf.RETRY_BASE_SECONDS, conf.RETRY_MAX_SECONDS, conf.RETRY_JITTER)

    def bounds(self, attempt: int) -> tuple[float, float]:
        """Return the smallest and largest delay after the ``attempt``-th failed attempt."""
        nominal = min(self.max_seconds, self.base_seconds * 2.0 ** max(attempt - 1, 0))
        return nominal * (1 - self.jitter), nominal * (1 + self.jitter)

    def delay(self, attempt: int, unit: float) -> float:
        """Return the delay for ``attempt`` given ``unit`` drawn uniformly from [-1, 1)."""
        nominal = min(self.max_seconds, self.base_seconds * 2.0 ** max(attempt - 1, 0))
        return nominal * (1 + self.jitter * unit)

    def sql_params(self) -> dict[str, float]:
        """Return the parameters the SQL backoff expression expects."""
        return {
            "retry_base": self.base_seconds,
            "retry_max": self.max_seconds,
            "retry_jitter": self.jitter,
        }
