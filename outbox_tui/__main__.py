"""``python -m outbox_tui``: the same entry point as the ``outbox-tui`` script."""

import sys

from outbox_tui.entry import main

if __name__ == "__main__":
    sys.exit(main())
