"The course's scaffolding: the naive loop, the contiguous cache, simulations and fixtures. The engine never imports it."
