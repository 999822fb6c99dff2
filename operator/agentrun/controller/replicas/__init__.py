"""Replicas sharing the runs: Lease membership, the ring that assigns runs, the handoff barrier."""
