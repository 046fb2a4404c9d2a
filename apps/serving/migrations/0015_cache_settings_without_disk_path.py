"""Stored cache settings lose ``adapter_cache.disk_cache.path``: nothing read it (a node's disk
cache is LORAHUB_NODE_CACHE_DIR), and the key is now refused, so a row saved by the console
(which kept it, unedited) would stop validating."""

from django.db import migrations


def drop_disk_path(apps, schema_editor):
    CacheSettings = apps.get_model("serving", "CacheSettings")
    for row in CacheSettings.objects.all():
        disk = row.data.get("adapter_cache", {}).get("disk_cache", {})
        if isinstance(disk, dict) and "path" in disk:
            del disk["path"]
            row.save(update_fields=["data"])


class Migration(migrations.Migration):
    dependencies = [("serving", "0014_telemetry_and_fleet_own_their_tables")]

    operations = [migrations.RunPython(drop_disk_path, migrations.RunPython.noop)]
