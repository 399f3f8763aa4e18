"""The GPU fleet steward's core. Nothing here imports ``azure.functions``."""
