"""The tooling around the plugin: the ``tba-ext`` commands' work (configs and launch, quickstart, compare, evaluate,
model factory, warm start, reports, doctor). The plugin a verl user installs for is ``tba_ext.core`` (the
equations and the replay policy), ``tba_ext.adapters`` (verl glue), ``tba_ext.cpu`` (the CPU runtime) and
``tba_ext.tasks`` (rewards and data), loaded by ``tba_ext.verl_plugin``; nothing there imports this package."""
