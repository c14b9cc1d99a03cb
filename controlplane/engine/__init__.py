"""The engine's pure contract: deciders, decisions, events, actions, observations.

Nothing in this package performs I/O; the store and the worker runtime are the shell.
"""
