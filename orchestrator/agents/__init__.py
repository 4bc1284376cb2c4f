"""External agents as a session's runtime: ACP agents (Codex, Claude Code, Gemini CLI, any
other) that the fleet starts per prompt on a turn worker's host and drives as their client."""
