"""The one exception type bertforge raises for bad input, bad files and bad settings.

Every message names the thing at fault (a file, a field, a line) and what is wrong with it, so the CLI can print
it as one line and exit non-zero without a traceback.
"""


class BertforgeError(Exception):
    """A problem with the user's input, files or settings (not a bug in bertforge)."""
