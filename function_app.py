"""The GPU fleet steward: one Azure Functions app, one blueprint per job.

Only registrations live here. Each blueprint parses its trigger and calls one entry point of
``shared.entrypoints``; the heavy SDKs are imported on first use, so this module imports fast.
"""

import azure.functions as func

from functions import health_events, health_sweep, migration, pool_requests, reconcile, remediation

app = func.FunctionApp()

for blueprint in (pool_requests.bp, reconcile.bp, health_sweep.bp, remediation.bp, migration.bp, health_events.bp):
    app.register_functions(blueprint)
