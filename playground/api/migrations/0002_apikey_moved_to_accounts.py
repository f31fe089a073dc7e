"""ApiKey moved to the accounts app (accounts/0002_apikey adopts it): the api app forgets the model in
Django's state only; the table and its rows stay where they are."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("api", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="ApiKey")]),
    ]
