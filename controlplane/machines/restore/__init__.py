"""The ``restore`` kind: create a pod from a checkpoint artifact on a target node. Pure."""
