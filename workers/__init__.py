"""Celery workers of agent-fleet: the app, its queues, and thin tasks per family."""
