"""Diagnosis: bottleneck, failure and usage findings from a run's intervals, live alerts, and runs
compared side by side.
"""
