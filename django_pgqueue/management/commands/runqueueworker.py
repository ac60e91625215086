"""``manage.py runqueueworker``: a thin shell over :class:`django_pgqueue.worker.Worker`."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from argparse import ArgumentParser
from typing import Any

from django.core import checks
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, InterfaceError, OperationalError, connections

from django_pgqueue.exceptions import ConfigurationError, NotMigrated
from django_pgqueue.store.tables import missing_tables
from django_pgqueue.tasks.sqlsync import sync_sql_settings
from django_pgqueue.worker import Worker, WorkerOptions, quiet_django_task_logs
from django_pgqueue.worker.reloader import run_with_reloader
from django_pgqueue.worker.supervisor import Supervisor

logger = logging.getLogger("django_pgqueue.worker")

_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


class Command(BaseCommand):
    # The checks run in handle(): under --reload, in the reloaded child, so that a task
    # module that does not import (a SyntaxError) is reported and watched, as runserver
    # does, instead of ending the command.
    requires_system_checks: tuple[str, ...] = ()
    help = (
        "Run a django-pgqueue worker: claim jobs from PostgreSQL, run them, record their "
        "outcomes. SIGTERM or Ctrl-C drains it; a second one stops it at once."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        """Declare the options; unset ones come from settings."""
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help="Queue to serve (repeatable). Default: all QUEUES of the backend.",
        )
        parser.add_argument("--concurrency", type=int, help="Jobs run at once per process.")
        parser.add_argument(
            "--prefetch", type=int, help="Extra jobs held beyond free slots (default 0)."
        )
        parser.add_argument(
            "--prefetch-window",
            type=float,
            metavar="SECONDS",
            help="Adaptive prefetch: also hold as many jobs as this process finishes in this "
            "time, at its measured rate, at most --batch-size (default 0.05; 0 turns it off).",
        )
        parser.add_argument("--batch-size", type=int, help="Most jobs claimed per round trip.")
        parser.add_argument(
            "--processes", type=int, default=1, help="Worker processes to run (default 1)."
        )
        parser.add_argument(
            "--burst", action="store_true", help="Exit 0 once no job is ready to run."
        )
        parser.add_argument("--max-jobs", type=int, help="Exit 0 after this many jobs.")
        parser.add_argument("--worker-id", help="Registry id (default: host:pid:random).")
        parser.add_argument("--lease-seconds", type=float, help="Lease length in seconds.")
        parser.add_argument(
            "--poll-interval", type=float, help="Fallback poll interval in seconds."
        )
        parser.add_argument(
            "--grace-seconds", type=float, help="Time running jobs get to finish on shutdown."
        )
        parser.add_argument(
            "--backend", default="default", help="TASKS alias to serve (default: 'default')."
        )
        parser.add_argument(
            "--reload",
            action="store_true",
            help="Restart the worker when Python code changes, as runserver does "
            "(for development).",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            metavar="PORT",
            help="Serve this process's Prometheus metrics on PORT (with --processes: the "
            "children's, summed). Needs the metrics extra.",
        )
        parser.add_argument(
            "--metrics-addr",
            default="0.0.0.0",  # noqa: S104 - scraped from other hosts, like any exporter
            metavar="ADDRESS",
            help="Address the metrics server binds (default 0.0.0.0).",
        )
        parser.add_argument(
            "--no-housekeeping",
            action="store_true",
            help="Never run housekeeping (reaping, pruning) in this worker.",
        )
        parser.add_argument("--skip-checks", action="store_true", help="Skip the system checks.")
        parser.add_argument(
            "--no-schedules",
            action="store_true",
            help="Never sync or fire periodic schedules in this worker.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Validate everything, then run the worker (or the supervisor) until it exits."""
        self._configure_logging(options["verbosity"])
        processes = options["processes"]
        if processes < 1:
            raise CommandError("--processes must be at least 1", returncode=2)
        if processes > 1 and options["worker_id"]:
            raise CommandError("--worker-id cannot be combined with --processes", returncode=2)
        if processes > 1 and options["reload"]:
            raise CommandError("--reload cannot be combined with --processes", returncode=2)
        if options["metrics_port"] is not None and options["reload"]:
            raise CommandError("--metrics-port cannot be combined with --reload", returncode=2)
        try:
            worker_options = WorkerOptions.from_settings(
                backend=options["backend"],
                queues=tuple(options["queues"]) if options["queues"] else None,
                concurrency=options["concurrency"],
                prefetch=options["prefetch"],
                prefetch_window=options["prefetch_window"],
                batch_size=options["batch_size"],
                burst=options["burst"],
                max_jobs=options["max_jobs"],
                worker_id=options["worker_id"],
                lease_seconds=options["lease_seconds"],
                poll_interval=options["poll_interval"],
                grace_seconds=options["grace_seconds"],
                housekeeping=False if options["no_housekeeping"] else None,
                schedules=False if options["no_schedules"] else None,
            )
        except ConfigurationError as error:
            raise CommandError(str(error), returncode=2) from error
        self._require_tables(worker_options.database)
        self._sync_sql_settings(worker_options.database)

        def run_checks() -> None:
            if not options["skip_checks"]:
                self.check()
                self._check_database(worker_options.database)

        if options["reload"]:
            run_with_reloader(worker_options, prepare=run_checks)
            return
        run_checks()
        if options["metrics_port"] is not None:
            self._serve_metrics(
                options["metrics_port"], options["metrics_addr"], multiprocess=processes > 1
            )
        try:
            if processes > 1:
                code = Supervisor(worker_options, processes).run()
            else:
                code = Worker(worker_options).run()
        except ConfigurationError as error:
            raise CommandError(str(error), returncode=2) from error
        if code:
            sys.exit(code)

    def _serve_metrics(self, port: int, addr: str, *, multiprocess: bool) -> None:
        """Start the metrics server before any worker runs (and before children fork)."""
        if not 0 < port < 65536:
            raise CommandError(f"--metrics-port must be a TCP port, not {port}", returncode=2)
        try:
            if multiprocess:
                from django_pgqueue.metrics.multiproc import prepare_multiprocess_dir

                prepare_multiprocess_dir()
            from django_pgqueue.metrics.worker import serve_worker_metrics

            serve_worker_metrics(port, addr)
        except ImportError as error:
            raise CommandError(str(error), returncode=2) from error
        except ConfigurationError as error:
            raise CommandError(str(error), returncode=2) from error
        except OSError as error:
            raise CommandError(
                f"--metrics-port {port}: cannot listen on {addr}:{port} ({error.strerror})",
                returncode=2,
            ) from error
        logging.getLogger("django_pgqueue.worker").info(
            "serving metrics on http://%s:%d/metrics", addr, port
        )

    def _require_tables(self, database: str) -> None:
        """Stop with one line, not a traceback per process, when migrate was not run."""
        try:
            missing = missing_tables(database)
        except DatabaseError:
            return  # unreachable for now: the worker waits for the database itself
        finally:
            # The worker uses connections of its own; don't keep this one idle.
            connections[database].close()
        if missing:
            raise CommandError(str(NotMigrated(database, missing)), returncode=2)

    def _sync_sql_settings(self, database: str) -> None:
        """Write the settings django_pgqueue_enqueue() applies, as this release has them."""
        try:
            sync_sql_settings(database, synced_by=f"runqueueworker pid {os.getpid()}")
        except DatabaseError as error:
            # Unreachable or not migrated to 0017 yet: SQL enqueues keep the last row.
            logger.warning("could not write the SQL enqueue settings: %s", error)
        finally:
            connections[database].close()

    def _check_database(self, alias: str) -> None:
        """Run the checks that need the database (E002, E007, W002)."""
        try:
            # Unreachable: the worker waits for the database and says so.
            with contextlib.suppress(OperationalError, InterfaceError):
                self.check(tags=[checks.Tags.database], databases=[alias])
        finally:
            connections[alias].close()  # the worker opens its own connections

    def _configure_logging(self, verbosity: int) -> None:
        quiet_django_task_logs()
        package_logger = logging.getLogger("django_pgqueue")
        if package_logger.handlers:
            return  # configured in LOGGING: leave it to the project
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s")
        )
        package_logger.addHandler(handler)
        package_logger.setLevel(_LEVELS.get(verbosity, logging.DEBUG))
        package_logger.propagate = False
