"""The judge, as Celery tasks: ``judge_releases`` runs on the beat (every
``LORAHUB_RELEASE_TICK_S``) and judges each active release whose plan's interval has passed;
``judge_release`` judges one now (a start, a resume)."""

from __future__ import annotations

import logging

from celery import shared_task

from apps.releases import nodes, services

logger = logging.getLogger(__name__)


@shared_task(name="apps.releases.tasks.judge_releases", ignore_result=True)
def judge_releases() -> dict[int, str]:
    outcomes = {}
    for release_id in services.due():
        try:
            outcomes[release_id] = services.judge(release_id)
        except Exception:  # one release's failure must not stop the others' judgements
            logger.exception("judging release %s failed; the next round tries again", release_id)
            outcomes[release_id] = "error"
    return outcomes


@shared_task(name="apps.releases.tasks.judge_release", ignore_result=True)
def judge_release(release_id: int) -> str:
    return services.judge(release_id)


@shared_task(name="apps.releases.tasks.cool_release", ignore_result=True)
def cool_release(release_id: int, started: float, actor: str) -> None:
    nodes.cool_down(release_id, started=started, actor=actor)
