from django.db import migrations


def backfill(apps, schema_editor):
    from apps.telemetry.writers import rebuild_rollups

    rebuild_rollups(
        apps.get_model("serving", "RequestMinute"),
        apps.get_model("serving", "RequestRollup"),
        platform_model=None,  # its table comes in 0011
    )


class Migration(migrations.Migration):
    dependencies = [("serving", "0003_rollup_histograms")]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
