"""``python -m detsampler.cli``: the ``detsampler`` command."""

import sys

from detsampler.cli import main

sys.exit(main())
