"""What both the recorder and the reports know about a run: its summary, its attempt chain, whether
its recorder is alive, the host name.
"""
