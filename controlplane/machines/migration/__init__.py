"""The ``migration`` kind: move a running pod to another node without losing its state. Pure."""
