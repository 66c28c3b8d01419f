"""The one exception type the CLI turns into a one-line message and exit code 2."""


class UserError(Exception):
    """A mistake the user can fix (bad flag, unknown profile, missing file).

    `k26-deploy` prints `k26-deploy: error: <message>` and exits with `code`,
    never a traceback.
    """

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code
