"""The team server: HTTP API over a PostgreSQL ledger (docs/SERVER.md)."""
