"""The seed-scale bench's S3 (``tests/harness/shaped_s3.py``): moto in a network namespace of
its own, its link shaped with tc's tbf and every request's first byte delayed. What a bench
reads its figures against, so it must do what it says, and leave nothing behind."""

from __future__ import annotations

import subprocess

from tests.harness.shaped_s3 import ShapedS3, namespaces


def test_the_shaped_s3_costs_what_it_is_set_to_and_leaves_nothing_behind():
    before = set(namespaces())
    with ShapedS3(rate_mbit=200, first_byte_ms=60) as s3:
        floors = s3.floors(size_mb=16, tries=2)
        netns, host_if, proc = s3.netns, s3._host_if, s3._proc
        assert netns in namespaces()
        shaped = subprocess.run(
            ["tc", "qdisc", "show", "dev", host_if], capture_output=True, text=True
        ).stdout
        assert "tbf" in shaped and "200Mbit" in shaped
    print(f"shaped S3 at 200 Mbit/s, 60 ms: {floors}")
    assert floors["first_byte_ms"] >= 60
    assert 10 < floors["mb_per_s"] <= 200 / 8 * 1.1  # the link, not the server, is the limit
    assert set(namespaces()) == before  # the namespace, its veth end and its qdisc went
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert host_if not in links
    assert proc is not None and proc.poll() is not None
