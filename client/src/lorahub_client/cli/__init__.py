"""``lorahub``: the tenant's command line.

Exit codes (docs/cli.md): 0 done; 2 usage (a bad flag, a folder that is not an adapter, no
server or key configured); 3 refused or rejected (the server's reason is printed verbatim);
4 not found; 5 the server unavailable (or failing) after the bounded retries, or a wait that
ran out. Every command takes ``--json``: the API's objects on stdout, and on failure
``{"error": {"code", "detail", "status", "exit"}}``; messages go to stderr.
"""

from __future__ import annotations

import typer

from lorahub_client.cli import account, adapters, aliases, evals, keys, releases
from lorahub_client.cli.session import main_options

app = typer.Typer(
    name="lorahub",
    help="Push adapters, follow their review, move aliases and run evaluations on lorahub.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
app.callback()(main_options)
app.add_typer(adapters.versions_app, name="versions")
app.add_typer(aliases.alias_app, name="alias")
app.add_typer(evals.eval_app, name="eval")
app.add_typer(keys.keys_app, name="keys")
app.add_typer(releases.release_app, name="release")
for command in (account.login, adapters.push, keys.audit, account.usage, account.chat):
    app.command()(command)
app.command()(adapters.pull)
app.command("version")(account.show_version)


def main() -> None:
    # Typer's own usage errors exit 2; everything else is handled per command.
    app(prog_name="lorahub")


if __name__ == "__main__":  # pragma: no cover
    main()
