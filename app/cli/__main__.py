"""``python -m app.cli``: the ``cahp`` command (used to start embedded workers with the same Python)."""

import sys

from app.cli import main

sys.exit(main())
