from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.demo import assets as demo_assets


class Command(BaseCommand):
    help = "Build the tiny demo base model and the trained demo LoRA adapters (idempotent)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--force", action="store_true", help="rebuild even if present")
        parser.add_argument(
            "--extra",
            type=int,
            default=0,
            metavar="N",
            help="also write N untrained, seeded adapters (extra-000...) for cache tests",
        )

    def handle(self, *args, force: bool, extra: int, **options) -> None:
        result = demo_assets.build_demo_assets(demo_dir=settings.LORAHUB_DEMO_DIR, force=force)
        if result.built:
            self.stdout.write(f"built demo assets in {result.seconds:.1f}s: {result.demo_dir}")
        else:
            self.stdout.write(f"demo assets already built: {result.demo_dir}")
        if extra:
            made = demo_assets.build_extra_adapters(demo_dir=settings.LORAHUB_DEMO_DIR, count=extra)
            self.stdout.write(f"{len(made)} extra adapters in {made[0].parent}")
