"""The application layer: the use cases the CLI and the HTTP API both call.

Submitting an operation, sending it a command, replaying and verifying histories, and
the drain's child submissions. It speaks to the store and to the cluster through ports;
it never imports a driver (the composition root, ``controlplane.wiring``, hands it one).
"""
