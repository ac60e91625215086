"""``manage.py queuehealth``: liveness and readiness probes, one line and an exit code."""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue.compat import task_backends
from django_pgqueue.conf import conf
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.features.health import ProbeResult, liveness, readiness
from django_pgqueue.tasks.backend import PgQueueBackend


class Command(BaseCommand):
    help = (
        "Probe the queue for Kubernetes and friends. --liveness: this host's worker has "
        "heartbeated within the worker timeout. --readiness: the database is reachable and "
        "migrated. Prints one line; exits 0 when healthy, 1 when not."
    )
    # Probes run every few seconds: the system checks would cost more than the probe.
    requires_system_checks: tuple[str, ...] = ()

    def add_arguments(self, parser: ArgumentParser) -> None:
        """Declare the options."""
        parser.add_argument("--liveness", action="store_true", help="Probe the worker.")
        parser.add_argument("--readiness", action="store_true", help="Probe the database.")
        parser.add_argument(
            "--worker-id", help="Probe this worker id rather than this host's workers."
        )
        parser.add_argument("--hostname", help="Probe this host's workers (default: this host).")
        parser.add_argument(
            "--timeout",
            type=float,
            help="Heartbeat age that fails liveness (default PGQUEUE_WORKER_TIMEOUT_SECONDS).",
        )
        parser.add_argument(
            "--connect-timeout", type=int, default=5, help="Seconds to connect (default 5)."
        )
        parser.add_argument(
            "--backend", default="default", help="TASKS alias to probe (default: 'default')."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the probes asked for (both when neither is named); exit 1 on the first failure."""
        database = self._database(options["backend"])
        probes = [name for name in ("readiness", "liveness") if options[name]]
        results: list[tuple[str, ProbeResult]] = []
        for probe in probes or ["readiness", "liveness"]:
            if probe == "readiness":
                result = readiness(database, connect_timeout=options["connect_timeout"])
            else:
                timeout = options["timeout"]
                if timeout is None:
                    try:
                        timeout = conf.WORKER_TIMEOUT_SECONDS
                    except ConfigurationError as error:
                        raise CommandError(str(error), returncode=2) from error
                result = liveness(
                    database,
                    timeout_seconds=timeout,
                    hostname=options["hostname"],
                    worker_id=options["worker_id"],
                    connect_timeout=options["connect_timeout"],
                )
            if not result.ok:
                self.stderr.write(f"{probe}: FAIL {result.reason}")
                sys.exit(1)
            results.append((probe, result))
        self.stdout.write("; ".join(f"{probe}: ok {result.reason}" for probe, result in results))

    def _database(self, backend_alias: str) -> str:
        if backend_alias not in task_backends.settings:
            raise CommandError(f"no TASKS backend named {backend_alias!r}", returncode=2)
        backend = task_backends[backend_alias]
        if not isinstance(backend, PgQueueBackend):
            raise CommandError(f"TASKS[{backend_alias!r}] is not a PgQueueBackend", returncode=2)
        return backend.database
