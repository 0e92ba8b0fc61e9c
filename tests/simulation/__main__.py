"""``make simulate``: see ``campaign.py``."""

import sys

from .campaign import main

sys.exit(main())
