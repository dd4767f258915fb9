import argparse
import json

from django.core.management.base import BaseCommand

from jobs.retention import retention_sweep


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--budget {raw!r} is not a number of seconds.") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--budget {raw!r} must be more than 0 seconds.")
    return value


class Command(BaseCommand):
    help = (
        "Run the retention sweep once: delete finished invocations, queue events, SDK "
        "result frames, daemon commands, queue samples and audit rows past their "
        "retention, in short batches, until nothing is due (or --budget seconds have "
        "passed), and print how many of each went."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--budget",
            type=_seconds,
            default=None,
            metavar="SECONDS",
            help="stop after this many seconds (the batch under way finishes); "
            "run it again to go on. Default: until nothing is due.",
        )

    def handle(self, *args, **options):
        self.stdout.write(json.dumps(retention_sweep(budget=options["budget"])))
