"""The steps several kinds share, each with its events, state and ``decide``: capture, source
operations, restore, garbage collection. Pure.
"""
