"""Fault-injection tests on the real broker: crashes, broker restarts, rebalance storms, poison input,
missing output topic and corrupt model. Run alone with `make test-faults`."""
