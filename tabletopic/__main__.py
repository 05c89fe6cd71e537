"""``python -m tabletopic``: the same as the ``tabletopic`` command."""

from tabletopic.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
