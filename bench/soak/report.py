"""The soak's output: a one-line summary, a table of checks, and the same as JSON."""

from __future__ import annotations

import os
import platform
from typing import Any

from bench.soak.runner import Result


def summary(result: Result) -> str:
    """``soak: 7 checks, 0 violations`` (plus the seed and the length of the fault phase)."""
    cfg = result.config
    return (
        f"soak: {len(result.checks)} checks, {result.violations} violations "
        f"(seed {cfg.seed}, {cfg.seconds:g}s of faults, {result.timings.get('total_s', 0):.0f}s "
        "wall clock)"
    )


def to_json(result: Result) -> dict[str, Any]:
    """Everything the run measured, as plain JSON."""
    cfg = result.config
    return {
        "summary": summary(result),
        "violations": result.violations,
        "seed": cfg.seed,
        "seconds": cfg.seconds,
        "settle": cfg.settle,
        "sessions": cfg.sessions,
        "checks": [
            {
                "name": c.name,
                "violations": c.violations,
                "detail": c.detail,
                "examples": c.examples,
            }
            for c in result.checks
        ],
        "traffic": result.traffic,
        "faults": result.faults,
        "timings": {k: round(v, 1) for k, v in result.timings.items()},
        "stateDir": result.state_dir,
        "machine": f"{platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }


def render(result: Result) -> str:
    """The summary line and a plain-text table (checks, then faults and traffic)."""
    lines = [summary(result), ""]
    width = max((len(c.name) for c in result.checks), default=10)
    lines.append(f"{'#':>2}  {'check':<{width}}  {'violations':>10}  detail")
    for n, c in enumerate(result.checks, start=1):
        lines.append(f"{n:>2}  {c.name:<{width}}  {c.violations:>10}  {c.detail}")
        for example in c.examples:
            lines.append(f"{'':>2}  {'':<{width}}  {'':>10}    e.g. {example}")
    lines.append("")
    lines.append("faults: " + (", ".join(f"{k} {v}" for k, v in result.faults.items()) or "none"))
    lines.append("traffic: " + ", ".join(f"{k}: {v}" for k, v in result.traffic.items()))
    lines.append("timings: " + ", ".join(f"{k} {v:.1f}" for k, v in result.timings.items()))
    if result.violations:
        lines.append(f"logs and Redis data kept in {result.state_dir}")
    return "\n".join(lines)
