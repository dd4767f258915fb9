"""The ASGI entry point: what `make run` and production serve (gunicorn's uvicorn workers,
gunicorn_conf.py). Serving is the edge package's (edge/application.py)."""

from lakeshore_admin.wsgi import application as wsgi_application  # sets Django up first

# isort: split
from edge.application import build

application = build(wsgi_application)
