"""One module per command group; each defines a click group that `lakeshore.cli` adds."""
