"""Adapters: the only code that talks to ARM, Kubernetes, Event Grid and Azure Storage. Never imports a job."""
