"""Progressive releases of an alias: prewarm → evaluate → shadow → canary steps → promote,
judged from the nodes' evidence by a periodic Celery task, rolled back on failed gates."""
