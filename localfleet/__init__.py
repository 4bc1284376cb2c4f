"""Local runners: a whole fleet on this machine, for ``fleet up``, ``fleet demo`` and the tests.

- ``fleet``: ``LocalFleet``, the family worker processes (each a real ``fleet worker``) and
  ``fleet up``'s API child, with their logs under ``<state_dir>/logs``;
- ``embedded``: the embedded Redis server (``EmbeddedRedis``, ``resolve_redis_url``), with
  ``redis_binary`` finding its ``redis-server``;
- ``discovery``: where a running ``fleet up`` publishes itself (``fleet.json``), so other
  commands find it without ``FLEET_REDIS_URL``;
- ``demo``: the end-to-end scenario of ``fleet demo``.

Imports run one way (``tests/test_import_graph.py``): ``localfleet`` may import
``orchestrator`` and ``workers`` (the demo builds a Celery dispatcher), never ``api``; it starts
the ``fleet`` commands as child processes (``python -m api.cli``). ``api`` imports it: the
commands of ``api/cli/`` are its typer glue, and ``api/context.py`` finds a running fleet
through ``discovery``.
"""
