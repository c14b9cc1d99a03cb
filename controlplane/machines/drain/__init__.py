"""The ``drain`` kind: empty a node by running its pods' migrations as child machines, within
limits. Pure.
"""
