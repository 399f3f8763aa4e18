"""The app's real reconciler functions (timer + nudge queue trigger) alone, for the delayed-nudge test."""

import azure.functions as func

from functions import reconcile

app = func.FunctionApp()
app.register_functions(reconcile.bp)
