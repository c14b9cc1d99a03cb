"""The ``checkpoint`` kind: capture one pod into an OCI artifact and prove it. Pure."""
