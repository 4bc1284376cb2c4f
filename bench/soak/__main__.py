"""``python -m bench.soak --minutes M [--seed S] [--sessions N] [--json]``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.soak import report
from bench.soak.runner import Config, run


def main(argv: list[str] | None = None) -> int:
    """Run a soak; exit 0 only when every check found zero violations."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="Fault soak: traffic over the HTTP API while Redis, the workers and the "
        "API are killed, stopped and squeezed; then checks that the promise held.",
    )
    parser.add_argument("--minutes", type=float, default=2.0, help="fault phase length")
    parser.add_argument("--seed", type=int, default=1, help="seed of traffic and faults")
    parser.add_argument("--sessions", type=int, default=24, help="root sessions to start with")
    parser.add_argument("--concurrency", type=int, default=4, help="client threads")
    parser.add_argument(
        "--settle",
        type=float,
        default=60.0,
        help="seconds after the faults stop within which every turn must be final",
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="keep state and logs here")
    parser.add_argument("--json", action="store_true", help="JSON on stdout (table on stderr)")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.settle <= 0 or args.sessions < 1 or args.concurrency < 1:
        parser.error("--minutes, --settle, --sessions and --concurrency must be positive")
    cfg = Config(
        seconds=args.minutes * 60,
        seed=args.seed,
        sessions=args.sessions,
        concurrency=args.concurrency,
        settle=args.settle,
        state_dir=args.state_dir,
    )
    result = run(cfg)
    if args.json:
        print(report.render(result), file=sys.stderr)
        print(json.dumps(report.to_json(result), indent=2))
    else:
        print(report.render(result))
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
