"""The LISTEN connection: wakes the dispatcher when jobs are enqueued, and passes on
lease notices (a job this worker runs was cancelled or its lease reaped)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection

from psycopg import sql

from django_pgqueue.store.pgconn import connect
from django_pgqueue.worker.connection import CONNECTION_ERRORS

__all__ = ["Listener"]

logger = logging.getLogger("django_pgqueue.worker")

# Longest time a blocking wait for notifications lasts, so a stop request is seen quickly.
_WAIT_SLICE = 0.25


class Listener(threading.Thread):
    """One dedicated connection per worker process, LISTENing on the queue channel.

    A notification is only a hint: its payload names a queue, and a matching one wakes
    the dispatcher to claim. After every (re)connect the dispatcher is woken as well, to
    rescan for anything enqueued while the connection was down.

    The same connection LISTENs on the lease channel (``lease_channel``): each payload
    goes to ``on_lease_notice``. A notice lost while the connection was down is made up
    for by the heartbeat, whose next lease extension finds the lease gone. And on the
    flow channel (``flow_channel``): a concurrency key of a served queue can start a
    job again; ``on_flow`` is called before the dispatcher is woken.
    """

    def __init__(
        self,
        *,
        alias: str,
        channel: str,
        queues: Collection[str],
        wake: Callable[[], None],
        name: str,
        lease_channel: str | None = None,
        on_lease_notice: Callable[[str], None] | None = None,
        flow_channel: str | None = None,
        on_flow: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="pgqueue-listener", daemon=True)
        self._alias = alias
        self._channel = channel
        self._queues = frozenset(queues)
        self._wake = wake
        self._lease_channel = lease_channel
        self._on_lease_notice = on_lease_notice
        self._flow_channel = flow_channel
        self._on_flow = on_flow
        self._connection_name = name
        self._stopping = threading.Event()
        self.connected = threading.Event()
        #: Number of (re)connections made; tests use it to see a reconnect happen.
        self.connections_made = 0

    def stop(self) -> None:
        """Ask the thread to finish (within a fraction of a second)."""
        self._stopping.set()

    def run(self) -> None:
        """Listen until stopped, reconnecting with backoff after connection errors."""
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                with connect(
                    self._alias, application_name=self._connection_name, prepare=False
                ) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                    for extra in (self._lease_channel, self._flow_channel):
                        if extra is not None:
                            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(extra)))
                    self.connections_made += 1
                    self.connected.set()
                    backoff = 0.1
                    # Rescan: notifications sent while we were away are lost.
                    if self._on_flow is not None:
                        self._on_flow()
                    self._wake()
                    while not self._stopping.is_set():
                        for notify in conn.notifies(timeout=_WAIT_SLICE):
                            if notify.channel == self._lease_channel:
                                if self._on_lease_notice is not None:
                                    self._on_lease_notice(notify.payload)
                            elif notify.payload in self._queues:
                                if notify.channel == self._flow_channel and self._on_flow:
                                    self._on_flow()
                                self._wake()
            except CONNECTION_ERRORS as error:
                self.connected.clear()
                if self._stopping.is_set():
                    return
                logger.warning(
                    "listener connection lost (%s); reconnecting in %.1fs", error, backoff
                )
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception:
                logger.exception("listener failed; restarting")
                self._stopping.wait(1.0)
