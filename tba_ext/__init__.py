"""tba-ext: Trajectory Balance with Asynchrony (arXiv 2503.18929) as a verl 0.9.x extension."""

__version__ = "0.1.0"
