"""The Django-facing task API: the ``django.tasks`` backend, ``@task``, the job context, results."""
