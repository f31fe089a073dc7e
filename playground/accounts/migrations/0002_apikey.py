"""ApiKey moves here from the api app: Django's state learns the model over the existing table `api_apikey`
(no schema change, every row kept), and the model's content type is relabelled, so admin permissions and
log entries that point at it follow it."""
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def _relabel(apps, schema_editor, old: str, new: str) -> None:
    content_types = apps.get_model("contenttypes", "ContentType").objects.using(schema_editor.connection.alias)
    if not content_types.filter(app_label=new, model="apikey").exists():
        content_types.filter(app_label=old, model="apikey").update(app_label=new)


def forwards(apps, schema_editor) -> None:
    _relabel(apps, schema_editor, "api", "accounts")


def backwards(apps, schema_editor) -> None:
    _relabel(apps, schema_editor, "accounts", "api")


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0001_initial"),
        ("api", "0002_apikey_moved_to_accounts"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ApiKey",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("name", models.CharField(blank=True, max_length=100)),
                        ("prefix", models.CharField(editable=False, help_text="first characters, to recognise the key", max_length=16)),
                        ("key_hash", models.CharField(editable=False, max_length=64, unique=True)),
                        ("revoked", models.BooleanField(default=False)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("last_used_at", models.DateTimeField(blank=True, editable=False, null=True)),
                        ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="api_keys", to=settings.AUTH_USER_MODEL)),
                    ],
                    options={"verbose_name": "API key", "ordering": ["-created_at"], "db_table": "api_apikey"},
                ),
            ],
        ),
        migrations.RunPython(forwards, backwards),
    ]
