"""The ``gpuledger report`` click group, shared by every report subcommand.

Report commands from several modules attach themselves here (``report run`` in report_cmds.py,
``report chargeback`` in the cost commands), so no module has to import another's commands.
"""

from __future__ import annotations

import click


@click.group("report")
def report_group() -> None:
    """Reports: a run explained (HTML / JSON / Markdown), chargeback and more."""
