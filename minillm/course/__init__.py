"The course's scaffolding: the naive loop, the contiguous cache, simulations, fixtures."
