"""Importers: runs recorded by other tools (training output directories) brought into the ledger."""
