"""Django's PostgreSQL backend, lending the pool's connections by share
(lakeshore_admin/dbpool.py). settings.py names it as the ENGINE when the pool is on."""
