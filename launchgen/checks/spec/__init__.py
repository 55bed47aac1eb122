"""Checks of the spec alone (and of the plan built from it): every verb runs them. One module per subject."""
