"""Pure-Python bookkeeping (no torch): sequences, the KV block manager, the scheduler and its frozen output."""
