"""Metering: GPU busy time from the driver's samples, exact integrals, intervals and their rollups,
who owns a GPU process, the run summary.
"""
