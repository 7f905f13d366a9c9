"""The verbs a user types: `up`, `down`, `check`, `forget`."""
