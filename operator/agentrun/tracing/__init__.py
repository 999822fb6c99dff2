"""OpenTelemetry traces of runs: an observer of loop events, beside metrics, never steering the loop."""
