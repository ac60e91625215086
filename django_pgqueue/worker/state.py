"""A worker's state: what its dispatcher, recorder and helpers share.

The worker is built in layers, one module each: this state, the recorder
(:mod:`~django_pgqueue.worker.recording`), lease keeping (:mod:`~django_pgqueue.worker.leases`),
shutdown (:mod:`~django_pgqueue.worker.shutdown`) and the dispatcher loop
(:mod:`~django_pgqueue.worker.loop`), each a subclass of the one before.
"""

from __future__ import annotations

import threading
import time
from queue import SimpleQueue

from django_pgqueue.conf import conf
from django_pgqueue.states import WorkerStatus
from django_pgqueue.store.retry import RetryPolicy
from django_pgqueue.store.values import ClaimedJob
from django_pgqueue.worker.batching import Batcher, BatchJobRunner
from django_pgqueue.worker.connection import ConnectionSlot
from django_pgqueue.worker.cursor import ClaimCursor
from django_pgqueue.worker.execution import Outcome
from django_pgqueue.worker.flight import InFlight
from django_pgqueue.worker.heartbeat import Heartbeat
from django_pgqueue.worker.horizon import SlowClaimWarning
from django_pgqueue.worker.housekeeping import Housekeeper
from django_pgqueue.worker.listener import Listener
from django_pgqueue.worker.options import WorkerOptions
from django_pgqueue.worker.pacing import AdaptivePrefetch
from django_pgqueue.worker.pools import AsyncRunner, ThreadPool
from django_pgqueue.worker.resolver import TaskResolver
from django_pgqueue.worker.scheduler import Scheduler
from django_pgqueue.worker.tally import OutcomeTally

__all__ = ["WorkerState"]


class WorkerState:
    """What a worker process holds: its options, connections, in-flight attempts and threads."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.id = options.worker_id
        self.processed = 0
        self.status = WorkerStatus.ALIVE
        self._stop_requests = 0
        #: A handler stuck past PGQUEUE_STUCK_HANDLER_GRACE_SECONDS: this process is
        #: draining to be replaced (see LeaseKeeper._replace_if_stuck).
        self._replacing = False
        #: Some attempt was marked stuck since the last scan found none: the loop's
        #: stuck-handler check costs one attribute read until then.
        self._stuck_marked = False
        self._stuck_grace = conf.STUCK_HANDLER_GRACE_SECONDS
        self._wake = threading.Event()
        self._outcomes: SimpleQueue[Outcome] = SimpleQueue()
        # Keyed by (job id, lease generation): one entry per attempt, see InFlight.
        self._flights: dict[tuple[int, int], InFlight] = {}
        self._flights_lock = threading.Lock()
        self._undelivered: list[Outcome] = []
        # Held by whoever writes outcomes: the recorder thread, or the dispatcher once
        # the recorder has stopped (shutdown).
        self._record_lock = threading.Lock()
        self._recorder: threading.Thread | None = None
        self._recorder_stop = threading.Event()
        self._recorder_error: BaseException | None = None
        # When the outcome write under way began (monotonic), None between writes: the
        # shutdown's watchdog cancels one that outlives the grace period.
        self._write_started: float | None = None
        # While the recorder runs it wakes the dispatcher after each write (capacity came
        # free); without it (shutdown), each delivered outcome does.
        self._wake_on_deliver = True
        self._masks: tuple[str | None, ...] | None = None
        self._counts: dict[str, list[int]] = {}
        self._counts_lock = threading.Lock()
        self._rotation = 0
        self._hungry: dict[str, bool] = {}
        # Where plain claims start while a long snapshot makes claims from the head slow.
        self._cursor = ClaimCursor()
        # Says, now and then, what made a claim from the head slow.
        self._slow_claims = SlowClaimWarning()
        # Whether the next claim should read partitions and concurrency keys
        # (claim_batch) rather than plain jobs alone (claim_batch_plain). Set by a claim
        # that left some open, a flow notification (a key's slot came free elsewhere),
        # an outcome of ours that freed a partition or slot, and at least once per poll
        # interval (_wants_flow); so a plain drain never reads flow-control state.
        self._flow_open = True
        self._flow_claimed_at = -float("inf")
        # An operator cancelled attempts not started yet: the dispatcher gives them back.
        self._cancels_to_hand_back = False
        # Jobs whose unknown task was already reported (a WARNING once per job per worker).
        self._unknown_reported: dict[int, None] = {}
        self._claim_sent_at = time.monotonic()
        self._adaptive = AdaptivePrefetch(
            options.prefetch_window, options.batch_size, options.concurrency
        )
        self._next_hand_back_check = 0.0
        self._retry_policy = RetryPolicy.from_settings()
        self._slot = ConnectionSlot(options.database, f"pgqueue dispatcher {self.id}", claims=True)
        self._recorder_slot = ConnectionSlot(options.database, f"pgqueue recorder {self.id}")
        self._control = ConnectionSlot(options.database, f"pgqueue heartbeat {self.id}")
        # Step writes of async tasks: never on the heartbeat's connection, so a step
        # write cannot delay a lease extension, nor wait for one.
        self._steps = ConnectionSlot(options.database, f"pgqueue steps {self.id}")
        self._resolver = TaskResolver()
        self._tally = OutcomeTally(self.id, options.log_summary_seconds)
        self._runner = BatchJobRunner(
            backend_alias=options.backend,
            database=options.database,
            worker_id=self.id,
            record_step=self._record_step,
        )
        self._batcher = Batcher(self, self._runner)
        self._pool: ThreadPool | None = None
        self._async = AsyncRunner(self._batcher.run_async, self._deliver)
        self._listener: Listener | None = None
        self._heartbeat: Heartbeat | None = None
        self._housekeeper: Housekeeper | None = None
        self._scheduler: Scheduler | None = None
        self.started = threading.Event()

    def _deliver(self, outcome: Outcome) -> None:
        outcome.flight.busy = False
        self._outcomes.put(outcome)
        if self._wake_on_deliver:
            self._wake.set()

    def _set_masks(self, masks: tuple[str | None, ...]) -> None:
        self._masks = masks

    def _record_step(self, job: ClaimedJob, step: str | None) -> None:
        # Async tasks only (sync ones write through their own thread's connection).
        self._steps.run(lambda store: store.set_step_if_leased(job.lease, step))
