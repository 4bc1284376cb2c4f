"""agent-fleet domain core: sessions, lineage, archive state, the step gate, the activity
census and the family runtimes. Framework-free: nothing here imports FastAPI or Celery."""
