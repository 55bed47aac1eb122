"""The one exception type for mistakes a user can fix (config, missing packages, missing caches, hardware).

Entry points print `str(err)` as one line and exit 2, without a traceback; everything else is a bug or an
environment failure and keeps its traceback.
"""

from __future__ import annotations


class TrainerSetupError(Exception):
    """A user-fixable problem; the message names the config field (or package) and the fix."""
