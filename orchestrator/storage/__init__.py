"""Redis storage: the client and its errors, the key schema, the Lua linker and prelude,
and what every write shares (events, audit, metrics, idempotency keys, bookkeeping)."""
