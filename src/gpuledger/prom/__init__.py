"""Prometheus exposition of gpuledger's figures (names: docs/PROMETHEUS.md).

Data, rendering and transport apart: ``series`` holds plain per-run snapshots (no Prometheus
import), ``families`` renders snapshots as metric families, ``live`` accumulates a recording
run's intervals into a snapshot, ``ledger_source`` reads snapshots from a ledger (the server's
``/metrics``) and ``serve`` runs the small HTTP endpoint of ``gpuledger run --metrics-port``.
"""
