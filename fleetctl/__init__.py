"""fleetctl: the command-line tool for the teams and operators who use the GPU fleet steward.

Teams submit GPU pool requests and follow them; operators see the fleet's status, remediations,
the breaker and the migration plan. It talks to the same storage queue and ledger table as the
app (and, for status and plan, to ARM and the clusters), with the app's own settings.
``python -m fleetctl --help``.
"""
