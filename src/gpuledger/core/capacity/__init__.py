"""Fleet capacity: every GPU-second of every physical GPU in exactly one state, the node agent's
meter, pools, and the capacity and fleet reports.
"""
