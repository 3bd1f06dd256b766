"""Communication: the fabric of named process groups, stage communicators (real, recording, sandbox), state transfer."""
