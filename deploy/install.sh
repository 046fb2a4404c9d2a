#!/bin/sh
# The install steps every lorahub image shares (control plane, CPU node, CUDA node), so they
# cannot drift. Two steps, so that a code change rebuilds only the second:
#
#   install.sh deps LOCK     a virtualenv at /opt/lorahub with exactly the committed lock (each
#                            file checked against its hash, nothing resolved at build time) and
#                            the service user (uid 10001) with its data folder
#   install.sh project       the project itself, editable from /app (its templates and static
#                            files live beside the code; vLLM's plugins need its metadata)
#
# Extra sources: the wheels in /wheelhouse, when the image copied one in, and the index named by
# TORCH_INDEX (PyTorch's CPU index for the CPU node); the lock's hashes still decide what may be
# installed. LORAHUB_VENV_SYSTEM_SITE=1: the virtualenv sees the base image's packages (the CUDA
# image's vLLM and torch are the official image's own).
set -eu
# the system's trust store (with deploy/ca-certificates/), not pip's and uv's own bundles
export PIP_CERT=/etc/ssl/certs/ca-certificates.crt UV_SYSTEM_CERTS=1
uv_version="0.13.9"
venv=/opt/lorahub

case "$1" in
deps)
    lock="$2"
    python3 -m venv ${LORAHUB_VENV_SYSTEM_SITE:+--system-site-packages} "$venv"
    "$venv/bin/pip" install --quiet --no-cache-dir "uv==${uv_version}"
    set --
    [ -d /wheelhouse ] && set -- "$@" --find-links /wheelhouse
    [ -n "${TORCH_INDEX:-}" ] && set -- "$@" --extra-index-url "$TORCH_INDEX"
    "$venv/bin/python" -m uv pip install --python "$venv/bin/python" --no-cache \
        --compile-bytecode --require-hashes --no-deps --index-strategy unsafe-best-match \
        "$@" -r "$lock"
    # django-ninja and the ninja build tool (vLLM's) both write a `ninja` package, and uv
    # writes packages in parallel: put django-ninja's files back last, then check its file is
    # the one in place (importing it would need Django's settings). Once the build tool's
    # won, and every node crash-looped on "cannot import NinjaAPI".
    if grep -q '^ninja==' "$lock" && grep -q '^django-ninja==' "$lock"; then
        awk '/^django-ninja==/ {p = 1} p {print; if ($0 !~ /\\$/) exit}' "$lock" \
            > /tmp/django-ninja.txt
        "$venv/bin/python" -m uv pip install --python "$venv/bin/python" --no-cache \
            --compile-bytecode --require-hashes --no-deps --reinstall \
            --index-strategy unsafe-best-match "$@" -r /tmp/django-ninja.txt
        rm /tmp/django-ninja.txt
    fi
    "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit('NinjaAPI' not in open(u.find_spec('ninja').origin).read())" || {
        echo "install.sh: django-ninja's ninja package was overwritten" >&2
        exit 1
    }
    # the service user, and its data folder with the places volumes are mounted on (a new
    # volume takes their owner)
    useradd --system --uid 10001 --gid 0 --home-dir /var/lib/lorahub \
        --shell /usr/sbin/nologin lorahub
    mkdir -p /var/lib/lorahub/keys /var/lib/lorahub/node-cache
    chown -R 10001:0 /var/lib/lorahub
    chmod -R 0770 /var/lib/lorahub
    ;;
project)
    "$venv/bin/python" -m uv pip install --python "$venv/bin/python" --no-cache --no-deps -e /app
    "$venv/bin/pip" uninstall --quiet --yes uv
    ;;
*)
    echo "usage: install.sh deps LOCK | install.sh project" >&2
    exit 2
    ;;
esac
