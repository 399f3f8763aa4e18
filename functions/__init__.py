"""Thin triggers: each module holds one blueprint that parses its trigger and calls ``shared.entrypoints``."""
