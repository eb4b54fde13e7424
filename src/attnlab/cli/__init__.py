"""Command-line entry points: each parses its arguments, calls the library, reports (``common.failures_reported``)."""
