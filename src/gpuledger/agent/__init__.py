"""The agent side of the team server: push runs from the local ledger's outbox (docs/SERVER.md)."""
