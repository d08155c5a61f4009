"""Where the warrenctl command is: on PATH, else beside the Python running the tests (a venv's
bin/, when the venv is not activated); None if neither has it."""

import os
import shutil
import sys

_beside = os.path.join(os.path.dirname(sys.executable), "warrenctl")
WARRENCTL = shutil.which("warrenctl") or (_beside if os.access(_beside, os.X_OK) else None)
