"""The lakeshore CLI client and daemon. No Django imports here: HTTP only."""
