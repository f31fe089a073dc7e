"""python manage.py create_api_key USERNAME [--name NAME]: print a new API key (creating the user if needed)."""
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from playground.accounts.models import ApiKey


class Command(BaseCommand):
    help = "Create an API key for USERNAME (the user is created, without a password, if it does not exist) and print it."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="a label for the key")

    def handle(self, *args, username: str, name: str, **options) -> None:
        user, created = get_user_model().objects.get_or_create(username=username)
        if created:
            user.set_unusable_password()
            user.save()
            self.stderr.write(f"created user {username} (no password; set one with changepassword to log in)")
        _, secret = ApiKey.objects.issue(user, name)
        self.stdout.write(secret)
