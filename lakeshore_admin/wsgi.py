import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")
django_application = get_wsgi_application()  # sets Django up

from edge.lean_path import LeanPath  # noqa: E402 - needs the apps loaded

# The daemon protocol's hot requests skip the middleware (edge/lean_path.py)
application = LeanPath(django_application)
