"""Who pays: chargeback groups and their sums, FOCUS 1.0 rows, and value for money (cost per epoch,
image and mAP point) with its trends and anomalies.
"""
