from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.demo import assets as demo_assets


class Command(BaseCommand):
    help = (
        "Build the tiny demo base model and the trained demo LoRA adapters (idempotent); "
        "--profile seed also builds the seed-scale profile (var/seed/: a wider base and 200 "
        "adapters of 37-74 MB, random weights, for benches)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--force", action="store_true", help="rebuild even if present")
        parser.add_argument(
            "--extra",
            type=int,
            default=0,
            metavar="N",
            help="also write N untrained, seeded adapters (extra-000...) for cache tests",
        )
        parser.add_argument("--profile", choices=("demo", "seed"), default="demo")
        parser.add_argument(
            "--adapters", type=int, default=200, help="with --profile seed: how many"
        )

    def handle(self, *args, force: bool, extra: int, profile: str, **options) -> None:
        result = demo_assets.build_demo_assets(demo_dir=settings.LORAHUB_DEMO_DIR, force=force)
        if result.built:
            self.stdout.write(f"built demo assets in {result.seconds:.1f}s: {result.demo_dir}")
        else:
            self.stdout.write(f"demo assets already built: {result.demo_dir}")
        if extra:
            made = demo_assets.build_extra_adapters(demo_dir=settings.LORAHUB_DEMO_DIR, count=extra)
            self.stdout.write(f"{len(made)} extra adapters in {made[0].parent}")
        if profile == "seed":
            from apps.demo.seed_profile import build_seed_profile

            if options["adapters"] < 1:
                raise CommandError("--adapters must be at least 1")
            seed = build_seed_profile(
                demo_dir=settings.LORAHUB_DEMO_DIR,
                out_dir=settings.VAR_DIR / "seed",
                adapters=options["adapters"],
                force=force,
            )
            self.stdout.write(f"seed profile: {seed.describe()}")
