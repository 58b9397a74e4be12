"""``python -m abl.cli``: the ``abl`` command."""

from . import main

main()
