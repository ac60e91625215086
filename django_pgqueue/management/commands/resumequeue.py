"""``manage.py resumequeue QUEUE``: let workers start a paused queue's jobs again."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue.exceptions import EnqueueError
from django_pgqueue.features.pausing import resume_queue


class Command(BaseCommand):
    help = "Resume a paused queue: its workers are woken and claim its jobs again."

    def add_arguments(self, parser: ArgumentParser) -> None:
        """Declare the queue and the options."""
        parser.add_argument("queue", help="The queue to resume.")
        parser.add_argument("--database", help="Database alias (default: the job table's).")

    def handle(self, *args: Any, **options: Any) -> None:
        """Resume the queue; say how long it was paused, or that it was not."""
        try:
            resumed = resume_queue(options["queue"], using=options["database"])
        except EnqueueError as error:
            raise CommandError(str(error), returncode=2) from error
        if resumed is None:
            self.stdout.write(f"Queue {options['queue']!r} was not paused; left as it was.")
        else:
            self.stdout.write(
                f"Resumed queue {resumed.queue!r} (paused since {resumed.paused_at.isoformat()})."
            )
