"""Framework-free core of tba-ext: TB equations, replay store and sampler, settings, step arithmetic. Never imports
verl."""
