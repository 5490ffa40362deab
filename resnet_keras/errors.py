"""The one exception type for problems the user can fix.

Entry points catch `UsageError` and print its message as a single line
(`error: ...`) and exit with status 2, so bad input never ends in a traceback.
Raise it with a message that names what to fix (the flag, the file, the
allowed values), not what went wrong inside the program.
"""


class UsageError(Exception):
  """A problem with the user's input (flags, files, directories)."""
