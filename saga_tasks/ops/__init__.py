"""Operator edges: the CLI and the read models it shares with the HTTP API."""
