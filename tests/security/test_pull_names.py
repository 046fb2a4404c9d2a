"""``lorahub pull`` writes only inside the folder it was given, whatever the server says.

The file names and the default folder (the version's label) come from the server: a broken or
hostile one listing ``../../.bashrc`` or ``/etc/cron.d/x`` must not write there. Here the
server is a real HTTP server on this machine that answers every download with bytes and
counts them; the client is the shipped one.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from lorahub_client.client import Client
from lorahub_client.errors import LorahubError
from lorahub_client.models import Version

PAYLOAD = b"echo pwned\n"


@pytest.fixture
def hostile_server() -> Iterator[tuple[str, list[str]]]:
    served: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", served
    server.shutdown()
    server.server_close()


def version_listing(*names: str, label_version: str = "v1") -> Version:
    digest = hashlib.sha256(PAYLOAD).hexdigest()
    return Version.model_validate(
        {
            "id": 1,
            "tenant": "acme",
            "adapter_id": "support",
            "version": label_version,
            "state": "approved",
            "base_model": "m",
            "base_model_revision": "r",
            "rank": 8,
            "lora_alpha": 16,
            "target_modules": [],
            "size_bytes": len(PAYLOAD),
            "files": {n: {"size": len(PAYLOAD), "sha256": digest} for n in names},
            "report": {},
            "manifest_digest": "",
            "training_data_summary": "",
            "uploaded_by": None,
            "rejection_reason": "",
            "reviewer": None,
            "review_note": "",
            "signed": True,
            "signing_key_id": "k",
            "created_at": datetime.now(UTC),
            "validated_at": None,
            "reviewed_at": None,
        }
    )


@pytest.mark.parametrize(
    "name",
    ["../../escaped.sh", "sub/../../escaped.sh", "{tmp}/escaped.sh", "..\\escaped.sh"],
)
def test_a_file_name_that_leaves_the_folder_is_refused_before_any_byte(
    hostile_server, tmp_path, name
):
    url, served = hostile_server
    name = name.format(tmp=tmp_path / "deep")  # an absolute path, inside the test's folder
    target = tmp_path / "deep" / "down" / "pulled"
    api = Client(url, "lh_key_for_the_test")
    with pytest.raises(LorahubError, match="not a plain file name; nothing was written"):
        api.pull(version_listing("adapter_config.json", name), target)
    assert served == []  # nothing downloaded
    assert not (tmp_path / "deep" / "escaped.sh").exists()
    assert not target.exists()


def test_the_default_folder_is_refused_when_the_label_is_a_path(
    hostile_server, tmp_path, monkeypatch
):
    from lorahub_client import cli
    from lorahub_client.cli import adapters
    from typer.testing import CliRunner

    url, served = hostile_server
    hostile = version_listing("adapter_config.json", label_version="../../../escaped")
    monkeypatch.chdir(tmp_path)
    # what the hostile server resolves the reference to
    monkeypatch.setattr(adapters, "version_to_pull", lambda api, ref: hostile)
    result = CliRunner().invoke(
        cli.app, ["pull", "acme/support@x"], env={"LORAHUB_URL": url, "LORAHUB_API_KEY": "k"}
    )
    assert result.exit_code != 0
    assert "not a plain file name" in result.output
    assert served == []


def test_plain_names_still_land_in_the_folder(hostile_server, tmp_path):
    url, _ = hostile_server
    target = tmp_path / "pulled"
    names = Client(url, "lh_key_for_the_test").pull(
        version_listing("adapter_config.json", "adapter_model.safetensors"), target
    )
    assert names == ["adapter_config.json", "adapter_model.safetensors", "model.sig"]
    assert sorted(p.name for p in target.iterdir()) == sorted(names)
