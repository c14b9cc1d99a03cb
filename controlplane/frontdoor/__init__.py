"""The Kubernetes-native front door: custom resources (``checkpoint.controlplane.dev``)
that ask for operations, and the mirror that writes what happened back to their status.

The event store stays the source of truth: a resource is a request (its UID is the
operation's id, so nothing is created twice) and a mirror (its status is recomputed from
the machine), never a second state machine. docs/resources.md has the kinds and the rules.
"""
