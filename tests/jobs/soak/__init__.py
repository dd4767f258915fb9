"""Soak tests: many HTTP daemons, chaos and a database restart against the live server."""
