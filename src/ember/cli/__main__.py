"""``python -m ember.cli``: the ``ember`` command."""

import sys

from ember.cli._main import main

sys.exit(main())
