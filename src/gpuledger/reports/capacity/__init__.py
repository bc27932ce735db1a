"""The capacity and fleet reports: read the fleet's day sums, add what wrapped runs say about GPUs
no agent watches, render them.
"""
