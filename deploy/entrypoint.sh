#!/bin/sh
# The command a lorahub container runs: `console`, `worker`, `webhooks`, `beat`, `migrate`
# (one-shot, the others wait for it) or `node`; anything else runs as given (`manage.py ...`).
# Each part is exec'd, so it receives the container's SIGTERM itself: gunicorn finishes its
# requests, Celery its tasks, a node drains (apps/serving/node/drain.py).
set -eu
cd /app
part="${1:-console}"
[ "$#" -gt 0 ] && shift

# Each part waits for what it needs instead of failing at once: `migrate` for PostgreSQL, the
# others for the schema `migrate` writes. Bounded: LORAHUB_WAIT_S (default 300 s), then it
# exits non-zero with the last error, and the orchestrator restarts it.
wait_for() {
    what="$1"
    shift
    deadline=$(( $(date +%s) + ${LORAHUB_WAIT_S:-300} ))
    until "$@" >/tmp/wait.log 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "gave up waiting for $what after ${LORAHUB_WAIT_S:-300} s:" >&2
            tail -n 20 /tmp/wait.log >&2
            exit 1
        fi
        echo "waiting for $what..." >&2
        sleep 3
    done
}
case "$part" in
    console | worker | webhooks | beat | node | migrate)
        # a missing or bad setting stops the container now, naming the variable
        python manage.py check --deploy --fail-level ERROR >/dev/null ;;
esac
case "$part" in
    console | worker | webhooks | beat | node)
        wait_for "the database schema (the migrate step)" python manage.py migrate --check ;;
esac

case "$part" in
    console)
        exec gunicorn lorahub.asgi:application \
            --worker-class lorahub.gunicorn_worker.ConsoleWorker \
            --bind "0.0.0.0:${LORAHUB_CONSOLE_PORT:-8000}" \
            --workers "${LORAHUB_CONSOLE_WORKERS:-2}" \
            --timeout 120 --graceful-timeout 30 \
            --no-control-socket \
            --access-logfile - "$@" ;;
    worker)
        exec celery -A lorahub worker --loglevel INFO -Q celery \
            --concurrency "${LORAHUB_WORKER_CONCURRENCY:-2}" "$@" ;;
    webhooks)
        # webhook deliveries alone: a slow receiver holds one of these slots, never a worker's
        exec celery -A lorahub worker --loglevel INFO -Q webhooks -n "webhooks@%h" \
            --concurrency "${LORAHUB_WEBHOOK_CONCURRENCY:-4}" "$@" ;;
    beat)
        # the schedule's state is rebuilt at start: the schedule itself lives in settings
        exec celery -A lorahub beat --loglevel INFO \
            --schedule /tmp/celerybeat-schedule "$@" ;;
    migrate)
        wait_for "the database" python manage.py migrate --noinput
        # the nodes' database role: reads the registry, writes request rows and rollups only
        if [ -n "${LORAHUB_NODE_DB_PASSWORD:-}" ]; then
            python manage.py node_db_role "${LORAHUB_NODE_DB_ROLE:-lorahub_node}"
        fi
        # publishes the signing key's public half (creates the key file when none is given)
        exec python manage.py init_signing_key ;;
    node)
        exec python manage.py runnode --host 0.0.0.0 \
            --port "${LORAHUB_NODE_PORT:-8001}" "$@" ;;
    *)
        exec "$part" "$@" ;;
esac
