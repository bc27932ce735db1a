"""Cost reports: a run's cost, the monthly chargeback (table, CSV, Markdown, HTML, FOCUS), rollups
and value for money.
"""
