"""One run read back for people: the run report, its per-epoch view and charts, compare, export,
top and the query views.
"""
