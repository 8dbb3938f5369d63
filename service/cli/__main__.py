"""``python -m tokenmold.service.cli``: the ``tokenmold`` command."""

import sys

from tokenmold.service.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
