"""Secrets at rest: TOTP keys and webhook secrets sealed with LORAHUB_FIELD_KEYS, recovery
codes replaced by keyed digests (apps/tenants/sealing.py). django-otp's key column is widened
on PostgreSQL to hold a sealed key (SQLite does not enforce a VARCHAR's length)."""

from __future__ import annotations

from django.db import migrations, models


def widen_totp_key(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE otp_totp_totpdevice ALTER COLUMN key TYPE varchar(255)")


def seal_existing(apps, schema_editor):
    from apps.tenants import sealing

    TOTPDevice = apps.get_model("otp_totp", "TOTPDevice")
    for device in TOTPDevice.objects.all():
        if not sealing.is_sealed(device.key):
            TOTPDevice.objects.filter(pk=device.pk).update(key=sealing.seal(device.key))
    StaticToken = apps.get_model("otp_static", "StaticToken")
    for token in StaticToken.objects.all():
        if len(token.token) < 16:  # a plain code (django-otp makes 8 characters)
            StaticToken.objects.filter(pk=token.pk).update(
                token=sealing.code_digests(token.token)[0]
            )
    Webhook = apps.get_model("tenants", "Webhook")
    for hook in Webhook.objects.all():
        if not sealing.is_sealed(hook.secret):
            Webhook.objects.filter(pk=hook.pk).update(secret=sealing.seal(hook.secret))


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0006_webhooks"),
        ("otp_totp", "0003_add_timestamps"),
        ("otp_static", "0003_add_timestamps"),
    ]

    operations = [
        migrations.AlterField(
            model_name="webhook", name="secret", field=models.CharField(max_length=255)
        ),
        migrations.CreateModel(
            name="SealedTOTPDevice",
            fields=[],
            options={"proxy": True, "indexes": [], "constraints": []},
            bases=("otp_totp.totpdevice",),
        ),
        migrations.CreateModel(
            name="HashedRecoveryCodes",
            fields=[],
            options={"proxy": True, "indexes": [], "constraints": []},
            bases=("otp_static.staticdevice",),
        ),
        migrations.RunPython(widen_totp_key, migrations.RunPython.noop),
        migrations.RunPython(seal_existing, migrations.RunPython.noop),
    ]
