"""Thin Celery tasks, one module per family: decode arguments, call the orchestrator, return
a small JSON outcome. The session id is always the first argument, so an operator can find a
session's work in Flower."""
