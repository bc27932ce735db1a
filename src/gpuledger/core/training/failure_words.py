"""The words every failure pattern of failures.py holds, apart from those patterns.

failures.py searches only the lines holding one of them, and candidates.py finds those lines with
Hyperscan, also in the output relay as it writes the log (lineindex.py): kept here so that the
relay gets them without importing the failure patterns and the log parser behind them.
tests/test_relay_parse.py generates matches of every pattern of failures.py not in its
DETAIL_PATTERNS and checks that these words find each one, so a new pattern cannot be missed.
"""

from __future__ import annotations

WORDS = (b"out of memory", b"OutOfMemoryError", b"CUBLAS_STATUS_ALLOC_FAILED", b"DataLoader worker", b"Killed")
WORDS_ANY_CASE = (b"nan", b"non-finite", b"dataset")  # found lower-cased: their patterns ignore case
# IGNORECASE also matches these with i or s, which lower-casing does not give: a log holding one
# has every line searched.
CASE_SPECIALS = ("\u0130", "\u0131", "\u017f")
