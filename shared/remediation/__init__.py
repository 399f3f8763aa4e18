"""Remediation: health evaluation, budgets, the breaker, the sweep, and the cordon-drain-repair steps."""
