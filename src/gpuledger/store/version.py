"""The ledger's current schema version, without the migrations (and SQLAlchemy) that reach it.

``gpuledger run`` checks it with the standard ``sqlite3`` module before it decides whether the
ledger needs SQLAlchemy at all (store/run_writer.py); migrations.py refuses to load if its last
migration is not this number.
"""

LATEST = 22
