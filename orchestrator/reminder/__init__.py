"""Reminders: stored scheduled prompts, their creation, claims and stops."""
