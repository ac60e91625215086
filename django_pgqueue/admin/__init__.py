"""The queue's admin pages: inbox, job detail, dead letters, lag, workers, schedules, flow.

Django's admin autodiscovery imports this package, which registers the pages on the
default admin site. Every change to a job goes through the queue manager.
"""

from django.contrib import admin

from ..models import ConcurrencyKey, DeadLetter, Job, Lag, Schedule, Worker
from .dead_letters import DeadLetterAdmin
from .flow import FlowControlAdmin
from .jobs import JobAdmin
from .lag import QueueLagAdmin
from .schedules import ScheduleAdmin
from .workers import WorkerAdmin

__all__ = [
    "DeadLetterAdmin",
    "FlowControlAdmin",
    "JobAdmin",
    "QueueLagAdmin",
    "ScheduleAdmin",
    "WorkerAdmin",
]

admin.site.register(Job, JobAdmin)
admin.site.register(DeadLetter, DeadLetterAdmin)
admin.site.register(Lag, QueueLagAdmin)
admin.site.register(Worker, WorkerAdmin)
admin.site.register(Schedule, ScheduleAdmin)
admin.site.register(ConcurrencyKey, FlowControlAdmin)
