"""``gpuledger completion bash|zsh|fish``: the shell completion script, as gh and kubectl print theirs.

The script is click's own (it asks ``gpuledger`` for the candidates at each Tab, through the
``_GPULEDGER_COMPLETE`` variable), so new commands and options complete without a new script.
"""

from __future__ import annotations

import click

PROG = "gpuledger"
COMPLETE_VAR = "_GPULEDGER_COMPLETE"
SHELLS = ("bash", "zsh", "fish")
HELP = """Print the shell completion script for SHELL.

\b
bash:  echo 'eval "$(gpuledger completion bash)"' >> ~/.bashrc
zsh:   echo 'eval "$(gpuledger completion zsh)"' >> ~/.zshrc
fish:  gpuledger completion fish > ~/.config/fish/completions/gpuledger.fish
"""


@click.command("completion", help=HELP)
@click.argument("shell", type=click.Choice(SHELLS))
def completion_cmd(shell: str) -> None:
    from click.shell_completion import get_completion_class

    from gpuledger.cli.main import cli

    completion = get_completion_class(shell)
    if completion is None:  # every shell of SHELLS is one click ships
        raise click.ClickException(f"no completion for {shell}")
    click.echo(completion(cli, {}, PROG, COMPLETE_VAR).source())
