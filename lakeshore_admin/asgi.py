"""ASGI entry point. Not what `make run` serves (gunicorn with threads, over WSGI: see
README "Deploying" for the measurement that chose it); kept for ASGI servers."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")
application = get_asgi_application()
