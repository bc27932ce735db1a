"""Trust: the audit log's hash chain, run seals, Ed25519 signing, access rules, and what a push may
change of a stored run.
"""
