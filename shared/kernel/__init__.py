"""The kernel: clock, errors, retry, settings, ports, records and the reconciler. Imports nothing else in shared."""
