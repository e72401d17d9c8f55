"""The deterministic Raft core: no I/O, no clock, no randomness except an injected seeded RNG."""
