"""The I/O shells: AWS clients, the lease table I/O, the shard reader, metrics, and the worker and manager
processes that drive the pure core's coroutines with real requests, threads and processes."""
