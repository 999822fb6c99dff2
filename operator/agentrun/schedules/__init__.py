"""What an AgentSchedule decides, as pure functions of its spec, its runs and an injected `now`.

Cron expressions and time zones (cron.py), the CronJob rules for missed times, concurrency and history
(deciding.py), and the runs' names and tasks (templates.py). No Kubernetes client, Kopf or clock here:
controller/schedules/ does the I/O and asks these modules what to do.
"""
