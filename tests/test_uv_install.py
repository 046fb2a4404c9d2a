"""make install says to uv what pip's configuration says about where packages come from, and
falls back to pip for anything it cannot translate."""

from __future__ import annotations

import pytest

from tools.uv_install import Untranslatable, parse_pip_config, uv_sources

# `pip config list` on this project's CI machine: files (global.*) and PIP_* variables (:env:)
LISTING = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels /srv/other-wheels'
"""


def test_the_sources_pip_is_configured_with_reach_uv():
    sources = uv_sources(parse_pip_config(LISTING))
    assert sources.args == [
        "--constraint",
        "/etc/xdg/pip/constraints.txt",
        "--extra-index-url",
        "file:///opt/pypi/simple",
        "--extra-index-url",
        "file:///opt/pypi-more/simple",
        # PIP_FIND_LINKS replaces the file's find-links, as it does for pip
        "--find-links",
        "/opt/wheels",
    ]
    assert sources.env == {
        "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
        "UV_HTTP_TIMEOUT": "180",
    }


def test_install_settings_win_over_global_ones_and_other_commands_do_not_apply():
    config = parse_pip_config(
        "download.index-url='https://elsewhere/simple'\n"
        "global.index-url='https://mirror.example/simple'\n"
        "install.index-url='https://install.example/simple'\n"
        "global.trusted-host='mirror.example'\n"
        "install.no-index='false'\n"
    )
    assert uv_sources(config).args == [
        "--index-url",
        "https://install.example/simple",
        "--allow-insecure-host",
        "mirror.example",
    ]
    assert uv_sources({"no-index": "yes"}).args == ["--no-index"]


def test_no_configuration_means_uv_s_defaults():
    assert uv_sources(parse_pip_config("")).args == []


@pytest.mark.parametrize(
    "listing", ["global.no-binary=':all:'", "install.user='true'", "global.proxy='http://p:3128'"]
)
def test_a_setting_uv_cannot_be_told_means_pip_installs(listing):
    with pytest.raises(Untranslatable, match=listing.split("=")[0].split(".")[1]):
        uv_sources(parse_pip_config(listing))
