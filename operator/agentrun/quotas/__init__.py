"""The accounting of AgentRunQuotas: pure, so it can be proved on paper and tested without a cluster.

ledger.py keeps one quota's status (admissions, reservations, windowed usage); windows.py says
what counts when; per_run.py is the per-run limit policy (maxima, defaults). The controller
(controller/quotas/) reads and writes the status; nothing here does I/O or reads the clock.
"""
