"""``manage.py pausequeue QUEUE``: stop workers starting a queue's jobs, at once."""

from __future__ import annotations

import getpass
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue.exceptions import EnqueueError
from django_pgqueue.features.pausing import pause_queue


class Command(BaseCommand):
    help = (
        "Pause a queue: from the next claim round on, no worker starts its jobs (running jobs "
        "finish; enqueueing carries on). Undo with resumequeue."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        """Declare the queue and the options."""
        parser.add_argument("queue", help="The queue to pause (one of TASKS' QUEUES).")
        parser.add_argument("--reason", default="", help="Why, shown in the admin.")
        parser.add_argument(
            "--by", help="Who pauses it, shown in the admin (default: the OS user)."
        )
        parser.add_argument("--database", help="Database alias (default: the job table's).")

    def handle(self, *args: Any, **options: Any) -> None:
        """Pause the queue; say since when, and by whom if it already was."""
        by = options["by"] if options["by"] is not None else _os_user()
        try:
            pause = pause_queue(
                options["queue"], by=by, reason=options["reason"], using=options["database"]
            )
        except EnqueueError as error:
            raise CommandError(str(error), returncode=2) from error
        moment = pause.paused_at.isoformat()
        if pause.created:
            self.stdout.write(f"Paused queue {pause.queue!r} at {moment}.")
        else:
            self.stdout.write(
                f"Queue {pause.queue!r} was already paused at {moment}"
                f"{f' by {pause.paused_by}' if pause.paused_by else ''}; left as it was."
            )


def _os_user() -> str:
    try:
        return f"{getpass.getuser()} (pausequeue)"
    except (KeyError, OSError):  # no user name for this uid (a container)
        return "pausequeue"
