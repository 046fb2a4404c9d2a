import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("serving", "0013_node_down_notified"),
        ("registry", "0005_alias_held_by"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # the tables stay as the serving app created them: only the owner changes
            state_operations=[
                migrations.CreateModel(
                    name="ServingNode",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("name", models.CharField(max_length=100, unique=True)),
                        ("url", models.CharField(max_length=200)),
                        ("base_model", models.CharField(blank=True, max_length=200)),
                        ("base_model_revision", models.CharField(blank=True, max_length=100)),
                        ("max_loras", models.PositiveIntegerField(default=0)),
                        ("max_cpu_loras", models.PositiveIntegerField(default=0)),
                        ("max_lora_rank", models.PositiveIntegerField(default=0)),
                        ("engine", models.CharField(blank=True, max_length=16)),
                        ("started_at", models.DateTimeField()),
                        ("heartbeat_at", models.DateTimeField()),
                        ("stopped_at", models.DateTimeField(blank=True, null=True)),
                        ("down_notified_at", models.DateTimeField(blank=True, null=True)),
                    ],
                    options={
                        "db_table": "serving_servingnode",
                        "ordering": ["name"],
                    },
                ),
                migrations.CreateModel(
                    name="Quarantine",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("node", models.CharField(max_length=100)),
                        ("tier", models.CharField(default="L4", max_length=4)),
                        ("reason", models.TextField()),
                        ("at", models.DateTimeField(auto_now_add=True)),
                        ("lifted_at", models.DateTimeField(blank=True, null=True)),
                        ("lift_note", models.TextField(blank=True)),
                        (
                            "lifted_by",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "version",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="quarantines",
                                to="registry.adapterversion",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "serving_quarantine",
                        "ordering": ["-at"],
                        "constraints": [
                            models.UniqueConstraint(
                                condition=models.Q(("lifted_at__isnull", True)),
                                fields=("version", "node"),
                                name="one_open_quarantine_per_node",
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
