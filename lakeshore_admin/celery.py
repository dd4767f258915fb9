"""The Celery app, configured from Django settings (namespace CELERY). Beat runs the
periodic ticks listed in settings.CELERY_BEAT_SCHEDULE; tasks are thin adapters over
the services (jobs/tasks.py)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")

app = Celery("lakeshore_admin")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
