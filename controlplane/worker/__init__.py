"""The worker shell around the pure core: claim, observe, decide, commit, act, release."""
