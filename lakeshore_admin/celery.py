"""The Celery app, configured from Django settings (namespace CELERY). Beat runs the
periodic ticks listed in settings.CELERY_BEAT_SCHEDULE; tasks are thin adapters over
the services (jobs/tasks.py)."""

import os

from celery import Celery
from celery.signals import worker_process_shutdown

from lakeshore_admin import metrics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lakeshore_admin.settings")

app = Celery("lakeshore_admin")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# A prefork pool's child ends without atexit: it writes what it counted (/metrics) here.
worker_process_shutdown.connect(metrics.flush_at_exit, weak=False)
