"""What a training printed and how it ended: per-epoch metrics from the log, epochs joined to
resources, failure causes, the stored log's cap.
"""
