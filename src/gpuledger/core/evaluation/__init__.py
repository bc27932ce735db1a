"""Evaluation runs (``yolo val | predict | benchmark``): the GPU usage over the evaluated span and
what an evaluation prints.
"""
