"""``python -m lorahub_client.cli``: the same as the ``lorahub`` command."""

from lorahub_client.cli import main

main()
