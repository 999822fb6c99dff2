"""AgentRunQuota I/O: the ledger writer, the watched view, the admission gate, run allowances, GC.

The accounting itself is pure (agentrun/quotas/); this package reads and writes it.
"""
