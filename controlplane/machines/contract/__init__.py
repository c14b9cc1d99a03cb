"""The contract with the data plane: the node agent's annotation protocol and the action
types the drivers perform. Pure.
"""
