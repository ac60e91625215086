"""The queue's admin pages: inbox, job detail, dead letters, lag, workers, schedules, flow.

Django's admin autodiscovery imports this package, which registers the pages on the
default admin site. Every change to a job goes through the queue manager.
"""

from django.contrib import admin

from django_pgqueue.admin.dead_letters import DeadLetterAdmin
from django_pgqueue.admin.flow import FlowControlAdmin
from django_pgqueue.admin.jobs import JobAdmin
from django_pgqueue.admin.lag import QueueLagAdmin
from django_pgqueue.admin.schedules import ScheduleAdmin
from django_pgqueue.admin.workers import WorkerAdmin
from django_pgqueue.models import ConcurrencyKey, DeadLetter, Job, Lag, Schedule, Worker

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
