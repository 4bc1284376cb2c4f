"""The fault soak: ``python -m bench.soak --minutes M [--seed S] [--sessions N] [--json]``.

Loopback only, bounded in time and count, stops by itself. It starts its own Redis
(append-only, ``appendfsync always``), one worker per family (two job hosts), the HTTP API
(bearer token) and ``fleet beat`` (the reconciler), drives archive / unarchive / prompt /
remind / spawn traffic over HTTP while faults are injected on a seeded schedule (SIGKILL and
SIGSTOP of Redis and of each worker, ``maxmemory`` squeezes, SIGKILL of the API, every
connection to Redis going silent, writes refused with ``NOREPLICAS``), releases every fault,
waits for recovery and checks that:

1. no model request began after the client got the 200 of an archive of its lineage;
2. every reminder was deleted by a stop, refused, or became exactly one turn;
3. every turn is final within the settle window (60 s) after the faults stopped;
4. no process exited except by the soak's own SIGKILL;
5. no HTTP answer was a 5xx other than the store's two 503s, ``store_unavailable`` and
   ``write_outcome_unknown`` (the connection dropped after a write was sent);
6. ``fleet_archives_total{outcome="archived"}`` and the audit trail match the archives the
   client saw acknowledged (attempts with no answer may or may not have committed);
7. after recovery, a new session's turn, job, reminder and subagent all complete;
8. no process of an archived session (a job's or a shell call's that left its process group,
   the ``escape`` fault) is alive 5 s after the archive's 200.

It exits 1 when any count is non-zero. Modules: ``procs`` (processes and signals),
``traffic`` (the HTTP client), ``faults`` (the schedule), ``evidence`` (what the store holds),
``checks``, ``runner``, ``report``.
"""
