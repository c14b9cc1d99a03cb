"""What every machine kind builds on: the state codec, cheap copies, phases, time and facts,
spec and reference parsing. Pure.
"""
