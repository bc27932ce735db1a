"""Raw interval series in a store made for them (docs/SCALE.md): compact fixed-point columns, a GPU
key instead of its UUID per row, retention by whole days. The ledger (SQLite/PostgreSQL) keeps runs,
accounts, the audit trail and rollups; a series store keeps the raw GPU and host intervals."""
