"""Thin verl adapters: each translates verl's tensors/config into a ``tba_ext.core`` call.

verl is imported before any adapter module runs: ``import verl`` loads tba-ext's plugin
(``tba_ext.verl_plugin``), which imports these modules. An adapter module imported first would otherwise reach
the plugin from its own first verl import, half-initialized, and the registration would fail.
"""

import verl  # noqa: F401
