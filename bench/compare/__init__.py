"""`make bench`: Lakeshore against raw SQL and procrastinate (see __main__.py)."""
