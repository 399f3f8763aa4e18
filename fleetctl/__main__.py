"""``python -m fleetctl``."""

import sys

from fleetctl.cli import main

if __name__ == "__main__":
    sys.exit(main())
