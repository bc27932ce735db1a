"""Keeping secrets out of the ledger: the redaction rules (redact_rules.toml) and the engine that
applies them to command lines, labels and logs.
"""
