"""`npumoe-lab platforms`: the platforms with the source of every parameter, and this host's CPU."""
from __future__ import annotations


def _platforms(args) -> int:
    from npumoe_lab.devices.hostcpu import platforms_report     # lazy: reads the platform YAMLs when run
    print(platforms_report())
    return 0


def register_cli(sub) -> None:
    q = sub.add_parser("platforms", help="list the platforms with their sources")
    q.set_defaults(func=_platforms)
