"""Management commands: runqueueworker, queuehealth, queuebench, pausequeue, resumequeue."""
