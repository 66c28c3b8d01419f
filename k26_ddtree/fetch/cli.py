"""Subcommands of the fetch family (being written)."""


def register(sub) -> None:
    """Add this family's subcommands to the k26-deploy parser."""
