"""Checkpoint classes (the operator's configuration of how a workload is checkpointed and
restored) and the saver/loader containers. Pure.
"""
