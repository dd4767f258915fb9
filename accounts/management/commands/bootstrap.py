import json
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from accounts import audit
from accounts.services import token_create


class Command(BaseCommand):
    help = (
        "First start: create the admin user with a random password and an operator token, "
        'and print them once as JSON ({"created": true, ...}). Later starts print '
        '{"created": false}. There is never a fixed default password.'
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    @transaction.atomic
    def handle(self, *args, username, **options):
        User = get_user_model()
        if User.objects.filter(username=username).exists():
            self.stdout.write(json.dumps({"created": False, "username": username}))
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        with audit.command("bootstrap"):
            _, token = token_create(username=username, role="operator", name="make run")
        self.stdout.write(
            json.dumps(
                {"created": True, "username": username, "password": password, "token": token}
            )
        )
