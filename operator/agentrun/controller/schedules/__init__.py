"""AgentSchedules: one task per schedule this replica owns, creating its runs when they are due.

The decisions (cron, missed times, concurrency, history, names, tasks) are pure functions in
agentrun/schedules/; this package reads the schedule and its runs, acts, and writes the status.
"""
