"""`python -m tilelink`: the `tilelink` command, for environments without the console script."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
