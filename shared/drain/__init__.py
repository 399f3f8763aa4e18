"""Draining nodes: kubectl's pod filters, one runner and one bounded parallel map, used by remediation and migration."""
