from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from accounts import audit
from accounts.models import Role
from accounts.services import token_create
from lakeshore_admin.errors import DomainError


class Command(BaseCommand):
    help = (
        "Create the user if needed, give it a role, and print a new API token of that role "
        "alone on stdout. The token never does more than its role, whatever else the user "
        "may do."
    )

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="user name (created if missing)")
        parser.add_argument("--role", required=True, choices=Role.values)
        parser.add_argument("--name", default="", help="a label for the token")
        parser.add_argument("--expires-days", type=int, default=None, help="expire after N days")
        parser.add_argument(
            "--queues",
            default=None,
            help="daemon tokens: comma-separated queue names its daemons may serve "
            "(default: any queue)",
        )

    def handle(self, *args, user, role, name, expires_days, queues, **options):
        if expires_days is not None and expires_days < 1:
            raise CommandError("--expires-days must be at least 1.")
        expires_at = timezone.now() + timedelta(days=expires_days) if expires_days else None
        scope = queues.split(",") if queues is not None else None
        try:
            with audit.command("create_token"):
                _, raw = token_create(
                    username=user, role=role, name=name, expires_at=expires_at, queues=scope
                )
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(raw)
