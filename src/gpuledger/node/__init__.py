"""The node agent (``gpuledger agent``): every GPU process on a node metered and attributed.

One long-running process per GPU node reads every GPU (the NVML collector in node mode, which
reports every process on every GPU), gathers facts about each GPU process from /proc, asks the
platforms on the node (Docker, the kubelet, Slurm) what they claim, attributes each process to an
owner chain — user → container → Kubernetes pod → Slurm job → a ``gpuledger run`` that wraps it —
and records the processes nobody wrapped as *discovered* runs in the same ledger, outbox and
reports as wrapped runs. ``claims.py`` is the contract between the platform adapters and the rest.
"""
