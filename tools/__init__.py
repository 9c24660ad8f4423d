"""Tools around saga_tasks and its example: the benchmark, the chaos run and the demo.

They drive the example in ``participants`` through the library; neither imports them.
Installed as the distribution ``saga-tasks-tools``, they add ``bench``, ``chaos`` and
``demo`` to the ``saga-tasks`` command.
"""
