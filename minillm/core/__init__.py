"The engine's core state: requests, the scheduler, the block manager and the KV pool."
