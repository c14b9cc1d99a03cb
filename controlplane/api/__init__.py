"""The HTTP API, Prometheus metrics and web dashboard of the control plane.

``make_app`` (in :mod:`controlplane.api.app`) builds the aiohttp application; a
composition root (the CLI) runs it. See ``docs/api.md``.
"""
