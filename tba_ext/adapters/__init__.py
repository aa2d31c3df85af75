"""Thin verl adapters: each translates verl's tensors/config into a ``tba_ext.core`` call."""
