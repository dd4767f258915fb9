"""The serving door: the ASGI application `make run` and production serve, its HTTP
protocol, its worker threads and the requests it answers on its event loop. The top
layer: only the entry points (lakeshore_admin/asgi.py, wsgi.py) import it."""
