from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("telemetry", "0001_initial"),
        ("fleet", "0001_initial"),
        ("serving", "0013_node_down_notified"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # the tables stay as the serving app created them: only the owner changes
            state_operations=[
                migrations.RemoveField(
                    model_name="cacheminute",
                    name="tenant",
                ),
                migrations.DeleteModel(
                    name="PlatformRollup",
                ),
                migrations.RemoveField(
                    model_name="quarantine",
                    name="lifted_by",
                ),
                migrations.RemoveField(
                    model_name="quarantine",
                    name="version",
                ),
                migrations.RemoveField(
                    model_name="requestlog",
                    name="tenant",
                ),
                migrations.RemoveField(
                    model_name="requestminute",
                    name="tenant",
                ),
                migrations.RemoveField(
                    model_name="requestrollup",
                    name="tenant",
                ),
                migrations.DeleteModel(
                    name="ServingNode",
                ),
                migrations.RemoveField(
                    model_name="shadowexample",
                    name="tenant",
                ),
                migrations.RemoveField(
                    model_name="shadowminute",
                    name="tenant",
                ),
                migrations.DeleteModel(
                    name="CacheMinute",
                ),
                migrations.DeleteModel(
                    name="Quarantine",
                ),
                migrations.DeleteModel(
                    name="RequestLog",
                ),
                migrations.DeleteModel(
                    name="RequestMinute",
                ),
                migrations.DeleteModel(
                    name="RequestRollup",
                ),
                migrations.DeleteModel(
                    name="ShadowExample",
                ),
                migrations.DeleteModel(
                    name="ShadowMinute",
                ),
            ],
            database_operations=[],
        ),
    ]
