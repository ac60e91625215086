"""Features built on the store and the task API.

Pausing, periodic schedules, workflows, waiting for a result, health probes.
"""
