"""The speed stage: the throughput walk over this machine's speed features (precision, memory
format, compile, DataLoader workers, the batch size...), one dimension at a time, each
candidate measured in interleaved rounds against the recipe so far."""
