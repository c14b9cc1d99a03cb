"""The ``suspend`` kind: checkpoint a pod (quiesced), then delete it, keeping its spec. Pure."""
