"""The lakeshore CLI client and daemon. No Django imports here: HTTP only."""

__version__ = "0.1.0"
