import json

from django.core.management.base import BaseCommand

from fleet.daemons import reap


class Command(BaseCommand):
    help = (
        "Run the reaper once: daemons past LAKESHORE_HEARTBEAT_TIMEOUT become lost (their "
        "invocations requeued or failed), invocations past timeout_s become timeout."
    )

    def handle(self, *args, **options):
        self.stdout.write(json.dumps(reap()))
