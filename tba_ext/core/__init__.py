"""Framework-free core of tba-ext: TB equations, replay store and sampler, settings. Never imports verl."""
