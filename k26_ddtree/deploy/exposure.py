"""Who can reach a port a unit listens on: loopback only, or the network, and then only with an API key.

A bind beyond loopback without a key serves the model to anyone on the
network. That takes an API key, or an opt-out the unit names in a comment.
"""

from __future__ import annotations

import ipaddress

from k26_ddtree.deploy.schema import Profile
from k26_ddtree.errors import UserError


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (a name other than localhost may resolve anywhere)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_port_comment(profile: Profile, key: str, host: str, port: int) -> list[str]:
    """The comment lines a unit carries for `host` (the profile's `key`): none on loopback or with an
    API key; the OPEN warning when the profile opts out; otherwise a UserError."""
    if profile.api_key or is_loopback(host):
        return []
    if not profile.open_without_api_key:
        raise UserError(
            f"profile {profile.name}: {key} {host} listens beyond loopback with no API key, so anyone who reaches "
            f"port {port} could use the model: set api_key: true (K26_API_KEY in env_file, mode 0600), "
            "or open_without_api_key: true to serve it open on purpose"
        )
    return [f"# OPEN: listens on {host} port {port} with no API key (open_without_api_key: true): "
            "anyone who reaches this port can use the model."]
