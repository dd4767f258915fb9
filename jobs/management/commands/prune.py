import json

from django.core.management.base import BaseCommand

from jobs.retention import retention_sweep


class Command(BaseCommand):
    help = (
        "Run the retention sweep once: delete finished invocations, queue events and SDK "
        "result frames older than LAKESHORE_RETENTION_DAYS, in batches, and print how many "
        "of each went "
        "(as the hourly beat task does; run it again to go on past its bound)."
    )

    def handle(self, *args, **options):
        self.stdout.write(json.dumps(retention_sweep()))
